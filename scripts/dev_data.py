"""The dataset the scripts read by default: makemore's names.txt as the package
ships it (engine/data/datasets/names.txt), as the tests read it."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the engine of this checkout

from engine.data.corpus import DEFAULT_DATASET_PATH  # noqa: E402

DEFAULT_DATA = str(DEFAULT_DATASET_PATH)
