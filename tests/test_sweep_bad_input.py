"""Ray missing, and Ray failing to start, are each one clear message from the
sweep's runner and from the command line (issue 30, bad input), with nothing
of Ray left running and the sweep's folder kept. Ray is hidden from a real
child process (sweep_support.HIDE_RAY), and made to fail for real: its
temporary folder (RAY_TMPDIR) is a file. The other kinds of bad input are
tested where they arise: an invalid sweep file in test_sweep_spec and
test_cli_sweep, a cluster out of reach in test_sweep_ray and test_sweep_job, a
diverging trial in test_sweep_trial, a failing one in test_sweep_ray."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.sweep import launch
from engine.sweep.connect import RAY_MISSING
from engine.sweep.events import RESULTS_FILE, SPEC_FILE
from sweep_support import HIDE_RAY, ROOT, Run, ray_environment, sweep_cli, write_spec

SWEEP = """
[sweep]
name = "bad"
search = "random"
trials = 2

[resources]
cpus = 1

[scheduler]
kind = "none"

[run]
preset = "tiny"
steps = 200
"""


def assert_one_error(run: Run, message: str) -> None:
    """The runner failed with message as its one error; the sweep's files say so too."""
    assert [e["message"] for e in run.of("error")] == [message]
    assert [e["event"] for e in run.events] == ["error", "sweep_ended"]
    assert run.events[-1]["status"] == "failed" and run.events[-1]["message"] == message
    assert launch.session_processes(run.process.process.pid) == []


def test_ray_missing_is_one_message(tmp_path):
    env = ray_environment(tmp_path)
    spec = write_spec(tmp_path, SWEEP)
    folder = tmp_path / "runner"
    run = Run(folder, env, spec, hide_ray=True)
    assert run.finish(timeout=120) == 1
    assert_one_error(run, RAY_MISSING)
    assert (folder / SPEC_FILE).read_text() == SWEEP and not (folder / "tune").exists()
    assert json.loads((folder / RESULTS_FILE).read_text())["message"] == RAY_MISSING

    # the command line says so before it starts a runner: one line, nothing on stdout
    cli = subprocess.run([sys.executable, "-c", f"{HIDE_RAY}; import runpy; runpy.run_path('main.py', "
                          "run_name='__main__')", "sweep", str(spec), "--dir", str(tmp_path / "cli")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and cli.stdout == ""
    assert cli.stderr == f"error: {RAY_MISSING}\n"
    assert not (tmp_path / "cli").exists()


@pytest.mark.ray
def test_ray_failing_to_start_is_one_message(tmp_path):
    pytest.importorskip("ray", reason="sweeps need Ray: pip install -e '.[test]'")
    not_a_folder = tmp_path / "ray-tmp"
    not_a_folder.write_text("")  # Ray's temporary folder cannot be made under a file
    env = ray_environment(tmp_path, RAY_TMPDIR=str(not_a_folder))
    spec = write_spec(tmp_path, SWEEP)
    message = f"Ray failed to start: [Errno 20] Not a directory: '{not_a_folder / 'ray'}'"
    folder = tmp_path / "runner"
    run = Run(folder, env, spec)
    assert run.finish(timeout=120) == 1
    assert_one_error(run, message)
    assert (folder / SPEC_FILE).read_text() == SWEEP and not (folder / "tune").exists()

    cli = sweep_cli(env, str(spec), "--dir", str(tmp_path / "cli"), timeout=120)
    assert cli.returncode == 1 and cli.stderr == f"error: {message}\n"
    assert cli.stdout.splitlines()[-1].startswith("sweep failed in ")
