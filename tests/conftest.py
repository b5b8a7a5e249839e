"""Shared fixtures for the whole suite (engine, GUI and backend tests).

The real dataset is makemore's names.txt as the package ships it
(engine/data/datasets/names.txt): the suite needs nothing outside the repository.
Nor does it write outside its own places (pytest_configure below).
"""
from __future__ import annotations

import random
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from engine import Corpus, ModelConfig, TrainConfig, default_dataset_path
from engine.data.corpus import CACHE_DIR_ENV, DATA_DIR_ENV

REPO_ROOT = Path(__file__).resolve().parents[1]

pytest_plugins = ["futhark_support", "checkpoint_support"]  # the Futhark and checkpoint tests' fixtures

SETTINGS_ENV = "MICROGPT_GUI_SETTINGS"  # gui.main_window's (not imported here: engine tests need no Qt)
CACHE_FOLDER = "microgpt-gui-cache"  # under pytest's cache folder: .pytest_cache/d/


def pytest_configure(config):
    """The suite's own places instead of the user's, set before any test runs and
    inherited by the processes tests start: the build cache (compiled Futhark
    backends) in pytest's cache folder, kept between runs so that the builds are
    not redone every run (`pytest --cache-clear` empties it); autosaves and the
    window's settings in a temporary folder removed at the end (tests/gui gives
    each test its own settings file as well)."""
    cache = getattr(config, "cache", None)
    if cache is not None:
        builds = cache.mkdir(CACHE_FOLDER)
    else:  # -p no:cacheprovider: nowhere to keep them, build in the temporary folder
        builds = None
    scratch = Path(tempfile.mkdtemp(prefix="microgpt-gui-tests-"))
    config.add_cleanup(lambda: shutil.rmtree(scratch, ignore_errors=True))
    environment = pytest.MonkeyPatch()
    config.add_cleanup(environment.undo)
    environment.setenv(CACHE_DIR_ENV, str(builds or scratch / "cache"))
    environment.setenv(DATA_DIR_ENV, str(scratch / "data"))
    environment.setenv(SETTINGS_ENV, str(scratch / "settings.ini"))



# A handful of names with a small alphabet: fast to train on, every backend can use it.
SMALL_NAMES = ["emma", "olivia", "ava", "isabella", "sophia", "mia", "amelia", "harper",
               "evelyn", "abigail", "emily", "ella", "elizabeth", "camila", "luna"]


@pytest.fixture(scope="session")
def names_path() -> Path:
    """Path of makemore's names.txt (32,033 names) as the package ships it, checked
    by its sha256 (a changed copy fails the tests that read it)."""
    return default_dataset_path()


@pytest.fixture(scope="session")
def names_corpus(names_path) -> Corpus:
    """The full names corpus in microgpt's training order (read once per session)."""
    return Corpus.from_file(names_path)


def read_microgpt_docs(path) -> list[str]:
    """microgpt's own loading and shuffling, with the global `random` module
    (an independent reference for engine.data.corpus's training order)."""
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


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails, as on a plane."""
    def unreachable(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket, "socket", unreachable)
    monkeypatch.setattr(socket, "create_connection", unreachable)
