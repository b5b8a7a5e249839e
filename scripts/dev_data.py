"""The dataset the scripts read by default: $MICROGPT_NAMES, else makemore's
names.txt in shared/data beside the repository, or beside a folder above it
(git worktrees kept in a subfolder), as tests/conftest.py looks for it."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def default_data() -> str:
    found = (d / "shared" / "data" / "names.txt" for d in ROOT.parents)
    return os.environ.get("MICROGPT_NAMES") or str(next(
        (p for p in found if p.is_file()), ROOT.parent / "shared" / "data" / "names.txt"))


DEFAULT_DATA = default_data()
