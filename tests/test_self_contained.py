"""The suite itself: a copy of the repository in a folder with nothing beside it
(no shared/ with a names.txt, no $MICROGPT_NAMES) runs its data tests with no
skips, reading the names.txt the package ships."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
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
