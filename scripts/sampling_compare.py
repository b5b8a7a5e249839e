"""Time sample() of this checkout's engine against another checkout's, interleaved
in one process (a measurement, not a test; the CPU may be shared).

    python scripts/sampling_compare.py OTHER_CHECKOUT CHECKPOINT COUNT [--seeds 3] [--limit S]

Loads CHECKPOINT (a .npz) into the NumPy backend of both engines, then for each
seed samples COUNT names at temperature 0.5 with the other engine and this one,
printing both times and whether the names are equal. --limit skips the other
engine's later seeds once one of its calls took longer than S seconds.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine  # noqa: E402


def import_engine_from(checkout: Path, name: str = "engine_other"):
    init = checkout / "engine" / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("other", type=Path)
    parser.add_argument("checkpoint")
    parser.add_argument("count", type=int)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--limit", type=float, default=float("inf"))
    args = parser.parse_args()
    other = import_engine_from(args.other)
    old, new = other.load_checkpoint(args.checkpoint), engine.load_checkpoint(args.checkpoint)
    slow = False
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        names_new = new.sample(args.count, 0.5, seed)
        t1 = time.perf_counter()
        names_old = None
        if not slow:
            names_old = old.sample(args.count, 0.5, seed)
        t2 = time.perf_counter()
        slow = slow or t2 - t1 > args.limit
        mean = sum(map(len, names_new)) / len(names_new)
        print(f"{args.checkpoint} seed {seed}: {args.count} names, mean length {mean:.1f}: "
              f"this {t1 - t0:.3f} s, other {'-' if names_old is None else f'{t2 - t1:.3f} s'}, "
              f"same names: {'-' if names_old is None else names_old == names_new}", flush=True)


if __name__ == "__main__":
    main()
