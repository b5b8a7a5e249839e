"""`python -m engine.futhark --regenerate`: rewrite kernels/generated/ from
kernels/**/*.fut (each build's program, generated.PROGRAMS) with the Futhark
compiler found (FUTHARK, or futhark on PATH); `--check`: exit 1, saying why,
if kernels/generated/ is out of step."""
from __future__ import annotations

import argparse
import sys

from ..errors import BackendError
from .generated import KERNEL_DIR, check, regenerate
from .tools import find_compiler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.futhark", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--regenerate", action="store_true",
                        help="generate kernels/generated/ from the kernel sources (needs futhark)")
    action.add_argument("--check", action="store_true",
                        help="check that kernels/generated/ matches the kernel sources")
    args = parser.parse_args(argv)
    try:
        if args.regenerate:
            regenerate(find_compiler(), KERNEL_DIR)
            return 0
        problems = check(KERNEL_DIR)
    except BackendError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"{KERNEL_DIR / 'generated'} matches the kernel sources")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
