"""Entry point of `microgpt-gui`: the window, or a headless subcommand.

    microgpt-gui [--data FILE]        open the window
    microgpt-gui demo [...]           train and sample in the terminal
    microgpt-gui bench [...]          measure the backends
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("demo", "bench"):
        from engine.cli import run_cli

        return run_cli(argv)
    from gui.app import run_gui

    return run_gui(argv)


if __name__ == "__main__":
    sys.exit(main())
