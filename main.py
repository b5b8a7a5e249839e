"""Entry point of `microgpt-gui`: the window, or a headless subcommand.

    microgpt-gui [--data FILE] [...]  open the window
    microgpt-gui demo [...]           train and sample in the terminal
    microgpt-gui bench [...]          measure the backends
    microgpt-gui sweep [...]          a hyperparameter sweep on Ray Tune

The window's options are parsed and checked (engine.cli.commands.window_args) before
Qt is imported, so --help, --version and every error need no display and no Qt.
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from engine.cli import commands as cli

    if argv and argv[0] in cli.COMMANDS:
        return cli.run_cli(argv)
    args, status = cli.window_args(argv)
    if args is None:
        return status
    try:
        from gui.app import leave, run_gui
    except ImportError as exc:  # Qt's system libraries missing, e.g. "libEGL.so.1: cannot open ..."
        print(f"error: Qt cannot load: {exc} (on Debian/Ubuntu, install the packages listed "
              "under \"System libraries for Qt\" in the README)", file=sys.stderr)
        return cli.EXIT_ERROR
    return leave(run_gui(args))


if __name__ == "__main__":
    sys.exit(main())
