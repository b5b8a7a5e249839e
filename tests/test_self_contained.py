"""The suite itself: it writes only into its own places, never the user's
folders; and a copy of the repository in a folder with nothing beside it (no
shared/ with a names.txt, no $MICROGPT_NAMES) runs its data tests with no
skips, reading the names.txt the package ships."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Not needed by the data tests, and large (the generated C is 30 MB): left out of the copy.
LEFT_OUT = shutil.ignore_patterns(".git", "__pycache__", ".pytest_cache", "*.egg-info", "build", "dist",
                                  ".venv", "generated", "docs")
DATA_TESTS = ["tests/test_data.py", "tests/test_cli.py::test_demo_trains_and_samples",
              "tests/test_cli.py::test_demo_and_bench_use_the_packaged_names_with_no_network"]


def alone() -> dict[str, str]:
    """The environment of a new user: no dataset named, nothing to import from elsewhere
    (HOME stays: the packages may be installed in the user's site folder)."""
    return {k: v for k, v in os.environ.items() if k not in ("MICROGPT_NAMES", "PYTHONPATH")}


def test_the_suite_builds_and_saves_in_its_own_places(request):
    """The suite wrote its Futhark builds into the user's cache (~/.cache/microgpt-gui/
    futhark, issue 27): conftest.py points the build cache at pytest's cache folder
    (kept between runs: the builds are not redone), and the data folder (autosaves)
    and the window's settings at a temporary folder."""
    from engine.data.corpus import CACHE_DIR_ENV, DATA_DIR_ENV, user_cache_dir, user_data_dir
    from engine.futhark.build import cache_root
    from engine.training.autosave import autosave_dir

    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    if cache is not None:
        assert cache_root() == cache.mkdir("microgpt-gui-cache") / "futhark"
    temporary = Path(tempfile.gettempdir())
    assert temporary in autosave_dir().parents and temporary in Path(os.environ["MICROGPT_GUI_SETTINGS"]).parents
    assert user_cache_dir() == Path(os.environ[CACHE_DIR_ENV]) and user_data_dir() == Path(os.environ[DATA_DIR_ENV])
    users = [Path.home() / ".cache", Path.home() / ".local" / "share", Path.home() / "Library"]
    for place in (cache_root(), autosave_dir()):
        assert not any(folder == place or folder in place.parents for folder in users), place


def test_the_cache_and_data_folders_follow_their_variables(monkeypatch, tmp_path):
    from engine.data.corpus import CACHE_DIR_ENV, DATA_DIR_ENV
    from engine.futhark.build import cache_root
    from engine.training.autosave import autosave_dir

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "c"))
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "d"))
    assert (cache_root(), autosave_dir()) == (tmp_path / "c" / "futhark", tmp_path / "d" / "autosaves")
    if sys.platform.startswith("linux"):  # unset or empty: the XDG folders, as before
        monkeypatch.setenv(CACHE_DIR_ENV, "")
        monkeypatch.delenv(DATA_DIR_ENV)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xc"))
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xd"))
        assert cache_root() == tmp_path / "xc" / "microgpt-gui" / "futhark"
        assert autosave_dir() == tmp_path / "xd" / "microgpt-gui" / "autosaves"


@pytest.mark.slow
def test_a_copy_with_nothing_beside_it_runs_the_data_tests_with_no_skips(tmp_path):
    copy = tmp_path / "clone" / "microgpt-gui"
    shutil.copytree(REPO_ROOT, copy, ignore=LEFT_OUT)
    assert not any((folder / "shared").exists() for folder in copy.parents)
    env = alone()
    where = subprocess.run([sys.executable, "-c", "import engine, engine.data.corpus as d; "
                            "print(engine.__file__); print(d.DEFAULT_DATASET_PATH)"],
                           cwd=copy, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.splitlines() == [str(copy / "engine" / "__init__.py"),
                                         str(copy / "engine" / "data" / "datasets" / "names.txt")], where.stderr
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *DATA_TESTS],
                            cwd=copy, env=env, capture_output=True, text=True, timeout=600)
    summary = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.fullmatch(r"=* ?\d+ passed in [\d.]+s( \(.*\))? ?=*", summary), summary
    assert "skipped" not in result.stdout and "names.txt not found" not in result.stdout


@pytest.mark.slow
def test_the_sdist_ships_names_txt_and_its_licence(tmp_path):
    """setuptools' own build (offline, no isolation) puts the dataset in the sdist;
    the wheel takes the same package data (pyproject's [tool.setuptools.package-data])."""
    import hashlib
    import tarfile

    copy = tmp_path / "microgpt-gui"
    shutil.copytree(REPO_ROOT, copy, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build",
                                                                      "dist", ".venv", ".pytest_cache"))
    build = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                            "print(b.build_sdist(sys.argv[1]))", str(tmp_path / "dist")],
                           cwd=copy, env=alone(), capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    name = build.stdout.strip().splitlines()[-1]
    with tarfile.open(tmp_path / "dist" / name) as sdist:
        members = {Path(m).relative_to(Path(m).parts[0]).as_posix(): m for m in sdist.getnames()}
        names = sdist.extractfile(members["engine/data/datasets/names.txt"]).read()
        licence = sdist.extractfile(members["engine/data/datasets/LICENSE-makemore.txt"]).read().decode()
    assert hashlib.sha256(names).hexdigest() == "0a30b5557f192f32ab962680889aac5f6fda0f4cecf40a6d0b5694f58ea8cc4d"
    assert "MIT License" in licence
    sources = (copy / "microgpt_gui.egg-info" / "SOURCES.txt").read_text().split()
    assert {"engine/data/datasets/names.txt", "engine/data/datasets/LICENSE-makemore.txt"} <= set(sources)
    # the header the multicore builds include (engine/futhark/cc.py SPIN_WAIT_HEADER)
    assert "engine/futhark/spin_wait.h" in members and "engine/futhark/spin_wait.h" in sources
