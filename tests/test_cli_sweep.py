"""`microgpt-gui sweep`: its checks before anything starts (one line, exit
status 2), and the shipped quick example run on a real local Ray through the
command line (a line per trial, the final table, --json)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cli_support import ROOT, run_in_process
from engine.sweep.spec import EXAMPLES

MINIMAL = "[run]\npreset = 'tiny'\nsteps = 100\n"


@pytest.mark.parametrize("make_args, words", [
    (lambda d: [str(d / "none.toml")], "none.toml: no such file (the shipped examples: "),
    (lambda d: [str(d / "bad.toml")], "bad.toml: [run] preset: unknown preset 'huge'"),
    (lambda d: [], "give a sweep file (SWEEP.toml), or --resume DIR"),
    (lambda d: ["--resume", str(d)], f"--resume {{d}}: no sweep there (it has no sweep.toml)"),
    (lambda d: [str(d / "ok.toml"), "--dir", str(d)], "is not empty: a sweep needs a folder of its own"),
    (lambda d: [str(d / "ok.toml"), "--json", str(d / "missing" / "r.json")], "the folder"),
    (lambda d: [str(d / "ok.toml"), "--address", "ray://head:10001"], "Ray Client (ray://) addresses are not used"),
    (lambda d: [str(d / "ok.toml"), "--address", "http://head:8265/x"], "is no job server address"),
])
def test_a_sweep_that_cannot_start_is_one_line_and_status_2(tmp_path, capsys, make_args, words):
    (tmp_path / "bad.toml").write_text("[run]\npreset = 'huge'\n")
    (tmp_path / "ok.toml").write_text(MINIMAL)
    code, out, err = run_in_process(["sweep", *make_args(tmp_path)], capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1
    assert words.replace("{d}", str(tmp_path)) in err


def test_resume_refuses_another_file(tmp_path, capsys):
    (tmp_path / "sweep.toml").write_text(MINIMAL)
    other = tmp_path / "other.toml"
    other.write_text(MINIMAL + "seed = 3\n")
    code, _, err = run_in_process(["sweep", str(other), "--resume", str(tmp_path)], capsys)
    assert code == 2 and "differs from the sweep in" in err


def test_sweep_help_names_the_examples(capsys):
    code, out, _ = run_in_process(["sweep", "--help"], capsys)
    assert code == 0 and "--address ADDR" in out and "--resume DIR" in out
    assert "quick" in out and "ten_minutes" in out and (EXAMPLES / "quick.toml").is_file()


@pytest.mark.ray
@pytest.mark.slow
def test_the_quick_example_runs_on_a_local_ray(tmp_path):
    pytest.importorskip("ray", reason="sweeps need Ray: pip install -e '.[test]'")
    from sweep_support import ray_environment

    out = tmp_path / "quick.json"
    done = subprocess.run([sys.executable, "main.py", "sweep", "quick", "--dir", str(tmp_path / "q"),
                           "--json", str(out)], cwd=ROOT, env=ray_environment(tmp_path), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    records = json.loads(out.read_text())
    assert len(records) >= 4
    for record in records:  # a line as each trial started and ended
        assert any(line.startswith(f"trial {record['trial']} started: learning_rate ") for line in lines)
        assert any(line.startswith(f"trial {record['trial']} {record['status']} at step ") for line in lines)
        assert set(record) >= {"settings", "status", "best_heldout", "final_heldout", "steps", "names_per_s"}
    statuses = {r["status"] for r in records}
    assert statuses <= {"done", "stopped early"} and "stopped early" in statuses
    table = lines.index("held-out loss of each trial (best first):")
    best = min(r["best_heldout"] for r in records)
    assert lines[table + 2].split()[2] == f"{best:.4f}"  # best first
    assert f"results: {tmp_path / 'q'}" in done.stdout and Path(tmp_path / "q" / "results.json").is_file()
