"""Running `python main.py ...` from the repository root as a new user would:
a clean environment (no display, no Qt platform, no Futhark), a fresh home;
or main.main in this process, its output captured."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import main

ROOT = Path(__file__).resolve().parents[1]


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """PATH and a fresh HOME only; FUTHARK names no compiler, so the Futhark
    backends build from the shipped C (as for a user without Futhark)."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "LANG": "C.UTF-8",
           "MICROGPT_GUI_SETTINGS": str(home / "settings.ini"), "XDG_DATA_HOME": str(home / "data"),
           "FUTHARK": str(home / "no-futhark-here")}
    env.update(extra)
    return env


def on_numpy(args: list[str]) -> list[str]:
    """demo's arguments with `--backend numpy` unless they name a backend: demo's default,
    auto, picks the fastest backend here and may start a Futhark build in the background,
    so the suite's demo runs name the backend they test (tests/test_auto_backend.py tests auto)."""
    if args[:1] == ["demo"] and "--backend" not in args:
        return ["demo", "--backend", "numpy", *args[1:]]
    return list(args)


def run_main(args: list[str], home: Path, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "main.py", *on_numpy(args)], cwd=ROOT, env=clean_env(home, **extra),
                          capture_output=True, text=True, timeout=timeout)


def run_in_process(argv: list[str], capsys) -> tuple[int, str, str]:
    """main.main(argv) here (fast, and monkeypatches apply): (exit status, stdout, stderr);
    demo on numpy unless argv names a backend (on_numpy)."""
    code = main.main(on_numpy(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write_lines(path: Path, lines: list[str]) -> Path:
    """A dataset file: one line per document."""
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
