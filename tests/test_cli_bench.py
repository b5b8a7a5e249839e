"""`microgpt-gui bench` on the command line: its table and JSON, skipped and
unknown backends, values refused before measuring, Futhark builds announced
first (engine.bench.measure's measurement itself: test_bench.py)."""
from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest

import engine
from cli_support import run_in_process as run, write_lines
from engine.backends import _REGISTRY
from engine.backends.speeds import this_cpu


def test_bench_builds_each_futhark_library_first_and_says_so(monkeypatch, capsys):
    """The rows' processes would each build silently: the parent builds, announced."""
    from engine.cli import commands as cli
    from engine.futhark import build as fb

    built = []

    def announced_build(target):
        start = fb.BuildEvent("start", fb.build_label(target), "shipped", "gcc 12.2.0", "0.25.34", "about 20-40 s")
        fb._announce(start)
        if target == "multicore":
            fb._announce(replace(start, phase="failed", seconds=1.2))
            raise engine.BackendError("the C compiler could not build it")  # its row will say so
        built.append(target)
        fb._announce(replace(start, phase="done", seconds=21.6))

    monkeypatch.setattr(fb, "build", announced_build)
    monkeypatch.setenv("MICROGPT_FUTHARK_THREADS", "2")
    # the libraries the rows will open, once each: B = 1 and batches are two programs per target
    cli.build_futhark_first(["numpy", "futhark-c", "futhark-multicore", "torch"], ["s256", "tiny"], [1, 32], 27)
    assert built == ["c", "c_batch", "multicore_batch"]
    assert capsys.readouterr().out.splitlines() == [
        "building futhark-c from the shipped C with gcc 12.2.0 (first use, about 20-40 s)...",
        "built futhark-c in 22 s",
        "building futhark-c (batches) from the shipped C with gcc 12.2.0 (first use, about 20-40 s)...",
        "built futhark-c (batches) in 22 s",
        "building futhark-multicore from the shipped C with gcc 12.2.0 (first use, about 20-40 s)...",
        "could not build futhark-multicore in 1 s",
        "building futhark-multicore (batches) from the shipped C with gcc 12.2.0 (first use, about 20-40 s)...",
        "built futhark-multicore (batches) in 22 s"]
    fb.build("c")  # the listener is gone once the builds are done
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("args, message", [
    (["--sample-names", "10001"], "--sample-names must be at most 10,000"),
    (["--json", "{tmp}/no/such/folder/bench.json"], "--json {tmp}/no/such/folder/bench.json: the folder "
                                                   "{tmp}/no/such/folder does not exist"),
    (["--json", "{tmp}"], "--json {tmp} is a folder; name a file in it"),
])
def test_a_bad_bench_value_is_refused_before_measuring(args, message, capsys, tmp_path):
    args = [a.format(tmp=tmp_path) for a in args]
    code, out, err = run(["bench", "--backends", "numpy", *args], capsys)
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {message.format(tmp=tmp_path)}") and err.count("\n") == 1


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
    assert doc["machine"]["cpu_kind"] == this_cpu()  # what a shipped table of these figures is keyed by
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
