"""The headless commands: `microgpt-gui demo` and `microgpt-gui bench`."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import engine
import main
from engine.backends import _REGISTRY

ROOT = Path(__file__).resolve().parents[1]
NAMES = ROOT.parent / "shared" / "data" / "names.txt"
needs_names = pytest.mark.skipif(not NAMES.is_file(), reason=f"dataset {NAMES} is absent")


def run(argv, capsys):
    code = main.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# demo ------------------------------------------------------------------------

@needs_names
def test_demo_trains_and_samples(capsys):
    code, out, err = run(["demo", "--data", str(NAMES), "--steps", "30", "--samples", "4",
                          "--temperature", "0.7", "--seed", "3"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    docs = [line.strip() for line in NAMES.read_text(encoding="utf-8").splitlines() if line.strip()]
    vocab = len(set("".join(docs))) + 1
    assert f"num docs: {len(docs)}" in lines
    assert f"vocab size: {vocab}" in lines
    assert f"expected initial loss: ln({vocab}) = {math.log(vocab):.4f}" in lines
    progress = [line for line in lines if line.startswith("step ")]
    assert progress[-1].startswith("step 30 / 30 | loss ")
    assert len(progress) >= 5

    # the final loss is what the engine itself gives for the same 30 steps and seed
    preset = engine.PRESETS["tiny"].with_steps(30)
    train = replace(preset.train, seed=3)
    corpus = engine.Corpus.from_file(NAMES)
    losses = engine.open_backend("numpy", preset.model, train, corpus).train(30)
    final = next(line for line in lines if line.startswith("final loss: "))
    assert final.startswith(f"final loss: {losses[-1]:.4f} (mean of the last 30 steps: {np.mean(losses):.4f}")

    samples = [line for line in lines if line.startswith("sample ")]
    assert [int(re.match(r"sample +(\d+): ", s).group(1)) for s in samples] == [1, 2, 3, 4]
    chars = set(corpus.chars)
    assert all(set(s.split(": ", 1)[1]) <= chars for s in samples)
    assert "Traceback" not in out + err


def test_demo_reports_truncated_documents(tmp_path, capsys):
    data = write_lines(tmp_path / "long.txt", ["ab", "c" * 20, "d" * 40, "ef"])
    code, out, err = run(["demo", "--data", str(data), "--steps", "3", "--samples", "1"], capsys)
    assert code == 0, err
    assert "num docs: 4" in out
    assert "truncated: 2 documents longer than 15 characters" in out


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "argument --steps: must be at least 1, got 0"),
    (["--steps", "ten"], "argument --steps: expected a whole number"),
    (["--samples", "-2"], "argument --samples: must be at least 1"),
    (["--temperature", "0"], "argument --temperature: must be a positive number"),
    (["--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
    (["--backend", "nope"], "unknown backend 'nope'"),
])
def test_demo_rejects_bad_arguments(args, message, tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", ["anna", "bob"])
    code, out, err = run(["demo", "--data", str(data), *args], capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err
    assert "sample" not in out


def test_demo_rejects_bad_data(tmp_path, capsys):
    code, _, err = run(["demo", "--data", str(tmp_path / "missing.txt")], capsys)
    assert code == 2 and err.startswith("error: dataset file not found:")

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"anna\nj\xf6rg\n")
    code, _, err = run(["demo", "--data", str(latin1)], capsys)
    assert code == 2 and "line 2 is not valid UTF-8" in err

    empty = write_lines(tmp_path / "empty.txt", ["", "   "])
    code, _, err = run(["demo", "--data", str(empty)], capsys)
    assert code == 2 and "no documents" in err
    assert err.count("\n") == 1  # one line, no traceback


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the data directory follows XDG_DATA_HOME on Linux")
def test_demo_offline_names_data_option(tmp_path, monkeypatch, capsys):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # no cached copy
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    code, out, err = run(["demo", "--steps", "1"], capsys)
    assert code == 2
    assert "could not download the default dataset" in err and "--data FILE" in err
    assert "Traceback" not in err and "num docs" not in out


def test_demo_reports_divergence_in_one_line(tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", ["anna", "bob", "carla", "dave"])
    code, out, err = run(["demo", "--data", str(data), "--steps", "50", "--lr", "1e30",
                          "--init-std", "1e10"], capsys)
    assert code == 1
    assert re.fullmatch(r"error: training diverged at step \d+: the loss became (nan|-?inf)\. .*\n", err)
    assert "sample" not in out


def test_error_exit_has_no_traceback_in_a_real_process(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "main.py"), "demo", "--data",
                           str(tmp_path / "nowhere.txt")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: dataset file not found")
    assert "Traceback" not in proc.stderr


# bench -----------------------------------------------------------------------

def test_bench_writes_json(tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", ["emma", "olivia", "ava", "isabella", "sophia", "zoe"])
    vocab = len(set("emmaoliviaavaisabellasophiazoe")) + 1
    report = tmp_path / "bench.json"
    code, out, err = run(["bench", "--backends", "numpy", "--presets", "tiny", "--steps", "6",
                          "--warmup", "1", "--json", str(report), "--data", str(data)], capsys)
    assert code == 0, err
    doc = json.loads(report.read_text(encoding="utf-8"))
    assert doc["command"][:2] == ["microgpt-gui", "bench"]
    assert doc["machine"]["numpy"] == np.__version__ and doc["machine"]["cores"] >= 1
    [row] = doc["results"]
    assert (row["backend"], row["preset"], row["status"]) == ("numpy", "tiny", "ok")
    assert row["params"] == 2 * vocab * 16 + 16 * 16 + 12 * 16 * 16  # wte, lm_head, wpe, one layer
    assert (row["steps"], row["warmup"]) == (6, 1)
    assert row["ms_per_step"] > 0 and row["steps_per_s"] == pytest.approx(1e3 / row["ms_per_step"])
    assert 1 < row["peak_rss_mb"] < 4096
    table = out.splitlines()
    assert table[1].split()[:4] == ["backend", "preset", "params", "ms/step"]
    assert table[2].split()[:3] == ["numpy", "tiny", f"{row['params']:,}"]


def test_bench_lists_unavailable_backends_as_skipped(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(_REGISTRY, "ghost", (lambda: (False, "no ghost device here"), None))
    data = write_lines(tmp_path / "names.txt", ["anna", "bob"])
    report = tmp_path / "bench.json"
    code, out, err = run(["bench", "--backends", "ghost", "--presets", "tiny", "--data", str(data),
                          "--json", str(report)], capsys)
    assert code == 0, err
    assert re.search(r"^ghost +- +skipped: no ghost device here$", out, re.MULTILINE)
    [row] = json.loads(report.read_text(encoding="utf-8"))["results"]
    assert (row["status"], row["reason"]) == ("skipped", "no ghost device here")


@pytest.mark.parametrize("args, message", [
    (["--backends", "numpy,warp"], "unknown backend 'warp'"),
    (["--presets", "tiny,giant"], "unknown preset 'giant'"),
    (["--steps", "0"], "argument --steps: must be at least 1"),
])
def test_bench_rejects_bad_arguments(args, message, tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", ["anna", "bob"])
    code, out, err = run(["bench", "--data", str(data), *args], capsys)
    assert code == 2
    assert message in err and "Traceback" not in err
