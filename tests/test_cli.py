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
from cli_support import run_main
from engine.backends import _REGISTRY, probe_backend

ROOT = Path(__file__).resolve().parents[1]


def run(argv, capsys):
    code = main.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


SMALL_DOCS = ["kate", "karl", "kai", "anna", "bob", "carla", "dave", "emma", "olivia", "ava", "sophia", "mia"]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# demo ------------------------------------------------------------------------

def test_demo_trains_and_samples(names_path, capsys):
    code, out, err = run(["demo", "--data", str(names_path), "--steps", "30", "--samples", "4",
                          "--temperature", "0.7", "--seed", "3"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    docs = [line.strip() for line in names_path.read_text(encoding="utf-8").splitlines() if line.strip()]
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
    corpus = engine.Corpus.from_file(names_path)
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


PRESET_CHOICES = ", ".join(engine.PRESETS)


@pytest.mark.parametrize("args, message", [
    (["demo", "--steps", "0"], "--steps must be at least 1, got 0"),
    (["demo", "--steps", "ten"], "--steps must be a whole number, got 'ten'"),
    (["demo", "--samples", "-2"], "--samples must be at least 1, got -2"),
    (["demo", "--temperature", "0"], "--temperature must be a positive number, got 0"),
    (["demo", "--lr", "inf"], "--lr must be a positive number, got inf"),
    (["demo", "--seed", "-1"], "--seed must be at least 0, got -1"),
    (["demo", "--preset", "huge"], f"--preset: unknown preset 'huge'; choose from {PRESET_CHOICES}"),
    (["demo", "--steps"], "--steps: expected one argument"),
    (["demo", "--bogus"], "unrecognized arguments: --bogus"),
    (["bench", "--steps", "0"], "--steps must be at least 1, got 0"),
    (["bench", "--seconds", "-1"], "--seconds must be a non-negative number, got -1"),
    (["bench", "--sample-names", "x"], "--sample-names must be a whole number, got 'x'"),
    (["bench", "--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["bench", "--presets", "tiny,giant"], f"--presets: unknown preset 'giant'; choose from {PRESET_CHOICES}"),
    (["bench", "--backends", ","], "--backends must be a comma-separated list of names"),
])
def test_a_bad_argument_is_one_line_and_status_2(args, message, tmp_path):
    """What a person sees in a terminal: exactly one line, no usage dump, nothing on stdout."""
    result = run_main(args, tmp_path)
    assert (result.returncode, result.stderr, result.stdout) == (2, f"error: {message}\n", "")


def test_demo_checks_the_backend_before_loading_the_dataset(tmp_path):
    data = write_lines(tmp_path / "names.txt", ["anna", "bob"])
    unknown = run_main(["demo", "--backend", "nope", "--data", str(data)], tmp_path)
    assert unknown.returncode == 2 and unknown.stdout == ""  # no "num docs" first
    assert unknown.stderr.startswith("error: unknown backend 'nope'; choose from numpy, ")
    assert unknown.stderr.count("\n") == 1

    # a backend that exists but cannot run here: status 1, before the (missing) file is looked at
    if probe_backend("futhark-cuda")[0]:
        pytest.skip("futhark-cuda can run on this machine")
    cannot = run_main(["demo", "--backend", "futhark-cuda", "--data", str(tmp_path / "missing.txt")], tmp_path)
    assert cannot.returncode == 1 and cannot.stdout == ""
    assert cannot.stderr.startswith("error: backend futhark-cuda cannot run here: ")
    assert cannot.stderr.count("\n") == 1


def test_demo_samples_names_with_the_prefix(tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", SMALL_DOCS)
    code, out, err = run(["demo", "--data", str(data), "--steps", "40", "--samples", "6", "--prefix", "ka",
                          "--seed", "4"], capsys)
    assert code == 0, err
    names = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("sample ")]
    # the engine itself, trained the same way, samples these names with that prefix
    preset = engine.PRESETS["tiny"].with_steps(40)
    backend = engine.open_backend("numpy", preset.model, replace(preset.train, seed=4),
                                  engine.Corpus.from_file(data))
    backend.train(40)
    assert names == backend.sample(6, 0.5, 4, prefix="ka")
    assert len(names) == 6 and all(name.startswith("ka") for name in names)


@pytest.mark.parametrize("prefix, message", [
    ("kZ", "--prefix 'kZ': character 'Z' is not in the vocabulary of this dataset"),
    ("a" * 16, "--prefix must be shorter than block_size (16), got 16 characters"),
])
def test_demo_rejects_a_prefix_it_cannot_sample_before_training(prefix, message, tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", SMALL_DOCS)
    code, out, err = run(["demo", "--data", str(data), "--steps", "5", "--prefix", prefix], capsys)
    assert (code, err) == (2, f"error: {message}\n")
    assert "step " not in out


def test_demo_warns_when_the_loss_climbs_far_above_ln_v(tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", SMALL_DOCS)
    code, out, err = run(["demo", "--data", str(data), "--steps", "200", "--lr", "10", "--samples", "1"], capsys)
    # finite but far above ln(V): a warning line on stderr, the run still ends normally
    assert code == 0
    [warning] = err.splitlines()
    assert warning.startswith("warning: the run is diverging: the mean loss of the last ")
    assert "sample  1: " in out

    code, out, err = run(["demo", "--data", str(data), "--steps", "200", "--samples", "1"], capsys)
    assert (code, err) == (0, "")


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
    code, out, err = run(["bench", "--backends", "numpy", "--presets", "tiny", "--steps", "6", "--seconds", "0",
                          "--warmup", "1", "--sample-names", "3", "--json", str(report), "--data", str(data)], capsys)
    assert code == 0, err
    doc = json.loads(report.read_text(encoding="utf-8"))
    assert doc["command"][:2] == ["microgpt-gui", "bench"]
    assert doc["machine"]["numpy"] == np.__version__ and doc["machine"]["cores"] >= 1
    [row] = doc["results"]
    assert (row["backend"], row["preset"], row["status"]) == ("numpy", "tiny", "ok")
    assert row["params"] == 2 * vocab * 16 + 16 * 16 + 12 * 16 * 16  # wte, lm_head, wpe, one layer
    assert (row["steps"], row["warmup"], row["chunks"], row["sample_names"]) == (6, 1, 6, 3)
    assert row["ms_per_step"] > 0 and row["steps_per_s"] == pytest.approx(1e3 / row["ms_per_step"])
    assert row["ms_min"] <= row["ms_per_step"] <= row["ms_max"]
    # the measured time is the calls' times: between all-fastest and all-slowest
    assert row["steps"] * row["ms_min"] * (1 - 1e-9) <= 1e3 * row["seconds"] <= row["steps"] * row["ms_max"] * (1 + 1e-9)
    assert row["sample_ms"] > 0 and 1 < row["peak_rss_mb"] < 4096
    assert row["cores"] == doc["machine"]["cores"]
    assert row["busy"] == (row["load_avg"] is not None and row["load_avg"] > row["cores"])
    table = out.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("backend "))
    assert table[header].split() == ["backend", "preset", "params", "ms/step", "min", "max", "steps/s",
                                     "sample", "ms", "peak", "MB", "steps", "s", "batch", "names/s", "load"]
    cells = table[header + 1].split()
    assert cells[:3] == ["numpy", "tiny", f"{row['params']:,}"]
    assert [float(c) for c in cells[3:6]] == pytest.approx([row["ms_per_step"], row["ms_min"], row["ms_max"]], abs=6e-4)
    assert ("busy" in cells) == row["busy"] == ("warning: the machine was busy" in out)
    assert (row["batch"], row["names_per_s"]) == (1, pytest.approx(row["steps_per_s"]))


def test_bench_lists_unavailable_backends_as_skipped(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(_REGISTRY, "ghost", (lambda: (False, "no ghost device here"), None))
    data = write_lines(tmp_path / "names.txt", ["anna", "bob"])
    report = tmp_path / "bench.json"
    code, out, err = run(["bench", "--backends", "ghost,numpy", "--presets", "tiny", "--data", str(data),
                          "--steps", "2", "--seconds", "0", "--warmup", "1", "--json", str(report)], capsys)
    assert code == 0, err
    assert re.search(r"^ghost +- +skipped: no ghost device here$", out, re.MULTILINE)
    skipped, measured = json.loads(report.read_text(encoding="utf-8"))["results"]
    assert (skipped["status"], skipped["reason"]) == ("skipped", "no ghost device here")
    assert (measured["backend"], measured["status"]) == ("numpy", "ok")


def test_bench_fails_when_no_requested_backend_can_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(_REGISTRY, "ghost", (lambda: (False, "no ghost device here"), None))
    monkeypatch.setitem(_REGISTRY, "phantom", (lambda: (False, "phantom driver too old"), None))
    report = tmp_path / "bench.json"
    code, out, err = run(["bench", "--backends", "ghost,phantom", "--data", str(tmp_path / "missing.txt"),
                          "--json", str(report)], capsys)
    assert (code, out) == (1, "")  # before the dataset is looked at, and nothing measured
    assert err.splitlines() == ["error: backend ghost cannot run here: no ghost device here",
                                "error: backend phantom cannot run here: phantom driver too old"]
    assert not report.exists()


def test_bench_rejects_an_unknown_backend(tmp_path, capsys):
    data = write_lines(tmp_path / "names.txt", ["anna", "bob"])
    code, out, err = run(["bench", "--data", str(data), "--backends", "numpy,warp"], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("error: unknown backend 'warp'; choose from numpy, ") and err.count("\n") == 1
