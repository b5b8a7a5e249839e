"""Shared fixtures for the whole suite (engine, GUI and backend tests).

The real dataset is makemore's names.txt in ../shared/data beside the
repository root (or $MICROGPT_NAMES); it is never copied into the repo, and
tests that need it skip with a stated reason where it is absent.
"""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from engine import Corpus, ModelConfig, TrainConfig

REPO_ROOT = Path(__file__).resolve().parents[1]

pytest_plugins = ["futhark_support", "checkpoint_support"]  # the Futhark and checkpoint tests' fixtures


def find_names_txt() -> Path:
    """$MICROGPT_NAMES if set, else shared/data/names.txt beside the repository root
    (../shared), or beside a folder above it (git worktrees kept in a subfolder)."""
    if os.environ.get("MICROGPT_NAMES"):
        return Path(os.environ["MICROGPT_NAMES"])
    for folder in REPO_ROOT.parents:
        candidate = folder / "shared" / "data" / "names.txt"
        if candidate.is_file():
            return candidate
    return REPO_ROOT.parent / "shared" / "data" / "names.txt"


NAMES_PATH = find_names_txt()

# A handful of names with a small alphabet: fast to train on, every backend can use it.
SMALL_NAMES = ["emma", "olivia", "ava", "isabella", "sophia", "mia", "amelia", "harper",
               "evelyn", "abigail", "emily", "ella", "elizabeth", "camila", "luna"]


@pytest.fixture(scope="session")
def names_path() -> Path:
    """Path of makemore's names.txt (32,033 names); skips where it is absent."""
    if not NAMES_PATH.is_file():
        pytest.skip(f"names.txt not found at {NAMES_PATH} (the shared dataset beside the repo)")
    return NAMES_PATH


@pytest.fixture(scope="session")
def names_corpus(names_path) -> Corpus:
    """The full names corpus in microgpt's training order (read once per session)."""
    return Corpus.from_file(names_path)


def read_microgpt_docs(path) -> list[str]:
    """microgpt's own loading and shuffling, with the global `random` module
    (an independent reference for engine.data's training order)."""
    docs = [line.strip() for line in Path(path).read_text().strip().split("\n") if line.strip()]
    saved = random.getstate()
    try:
        random.seed(42)
        random.shuffle(docs)
    finally:
        random.setstate(saved)
    return docs


@pytest.fixture(scope="session")
def microgpt_docs():
    """read_microgpt_docs: a function of the dataset's path."""
    return read_microgpt_docs


@pytest.fixture(scope="session")
def small_corpus() -> Corpus:
    """A 15-name corpus that needs no data file."""
    return Corpus.from_lines(SMALL_NAMES)


@pytest.fixture
def small_model() -> ModelConfig:
    """A two-layer, two-head model small enough for many steps in a test."""
    return ModelConfig(n_embd=8, n_layer=2, n_head=2, block_size=8)


@pytest.fixture
def short_train() -> TrainConfig:
    """microgpt's hyperparameters over a short run."""
    return TrainConfig(num_steps=20)

