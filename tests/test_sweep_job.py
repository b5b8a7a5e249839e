"""Sweeps submitted as Ray jobs to a real two-node cluster on this machine,
through its job server (`--address http://127.0.0.1:D`): a head with its
dashboard on 127.0.0.1 and a second node, one CPU each, token authentication
with the test's own token for every process, usage statistics off, the
cluster's data folder (where job sweeps write) in the test's folder.

The command line's sweep streams its events while the job runs, its trials
run on both nodes, and its results, events and job.json land in the local
folder as they come; a trial is stopped by a small job and the sweep by
stopping its job, which Tune survives: --resume submits it again and skips
the finished trials. An unreachable job server, a refused token and an
address of the wrong kind are one line each. Ending the cluster's processes
leaves none (sweep_support.Cluster: never `ray stop`, which would end every
Ray process of the machine)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="sweeps need Ray: pip install -e '.[test]'")
pytest.importorskip("aiohttp", reason="sweeps as Ray jobs need ray[default]: pip install -e '.[test]'")

from engine.sweep.events import EVENTS_FILE, RESULTS_FILE, SPEC_FILE, read_events  # noqa: E402
from engine.sweep.job import COMMANDS_FILE, JOB_FILE  # noqa: E402
from engine.training.checkpoint import read_checkpoint  # noqa: E402
from sweep_support import (ROOT, Cluster, Run, four_trial_sweep, free_port, ray_environment,  # noqa: E402
                           sweep_cli, write_spec)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

JOB_SWEEP = four_trial_sweep("job", report_every_s=0.2)

# Long enough that a Stop sent by a job of its own (seconds on a busy machine) reaches the
# first trial before it ends: with 20,000 tiny steps (a few seconds on NumPy) the
# first trial once finished before its Stop.
STOP_STEPS = 100_000
STOP_SWEEP = f"""
[sweep]
name = "stop"
search = "grid"
max_concurrent = 1
report_every_s = 0.1
checkpoint_every_s = 0.5

[scheduler]
kind = "none"

[run]
preset = "tiny"
steps = {STOP_STEPS}

[space]
seed = {{ grid = [1, 2, 3] }}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("job-cluster")
    # MICROGPT_GUI_DATA_DIR on the cluster: where its job sweeps write (docs/sweeps.md)
    env = ray_environment(folder, MICROGPT_GUI_DATA_DIR=str(folder / "cluster-data"))
    started = Cluster(env, job_server=True)
    try:
        yield started.start()
    finally:
        started.stop()


def job_status(cluster, job: str) -> str:
    """The job's status, from the job server's REST API with the cluster's token."""
    import requests

    token = Path(cluster.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    reply = requests.get(f"{cluster.job_address}/api/jobs/{job}", headers={"Authorization": f"Bearer {token}"},
                         timeout=30)
    reply.raise_for_status()
    return reply.json()["status"]


def test_a_sweep_runs_as_a_job_streaming_its_events_here(cluster, tmp_path):
    spec = write_spec(tmp_path, JOB_SWEEP)
    folder, out = tmp_path / "sweep", tmp_path / "results.json"
    cli = subprocess.Popen([sys.executable, "main.py", "sweep", str(spec), "--address", cluster.job_address,
                            "--dir", str(folder), "--json", str(out)], cwd=ROOT, env=cluster.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in cli.stdout:  # the trials' lines come while the job runs
            lines.append(line.rstrip("\n"))
            if " started: learning_rate " in line:
                job = json.loads((folder / JOB_FILE).read_text())["job"]
                assert job_status(cluster, job) == "RUNNING"
                break
        rest, err = cli.communicate(timeout=300)
    finally:
        cli.kill()
    lines += rest.splitlines()
    assert cli.returncode == 0, err[-3000:]
    assert lines[0] == (f"sweep job: 4 trials (random search, no early stopping), 1 CPU each, as a Ray job on "
                        f"the cluster at {cluster.job_address}")
    assert f"submitted Ray job {job} to {cluster.job_address}" in lines
    assert any(line.startswith(f"Ray: 2 CPUs on 2 nodes ({cluster.job_address}, job {job}") for line in lines)

    records = json.loads(out.read_text())
    assert len(records) == 4 and {r["status"] for r in records} == {"done"} and {r["steps"] for r in records} == {6000}
    assert len({r["node"] for r in records}) == 2  # trials ran on both nodes
    # the local folder: the sweep file, every event as it came, the table, where the job runs
    info = json.loads((folder / JOB_FILE).read_text())
    cluster_dir = Path(info["cluster_dir"])
    assert info["address"] == cluster.job_address and info["job"] == job
    assert cluster_dir.parent == Path(cluster.env["MICROGPT_GUI_DATA_DIR"]) / "sweep-jobs"
    assert (folder / SPEC_FILE).read_text() == JOB_SWEEP
    local = read_events(folder / EVENTS_FILE)
    there = read_events(cluster_dir / EVENTS_FILE)  # the runner's own, on the cluster
    assert [e for e in local if e["event"] != "job"] == [
        {**e, "dir": str(folder), "address": cluster.job_address, "job": job, "cluster_dir": str(cluster_dir)}
        if e["event"] == "sweep" else e for e in there]
    assert local[0]["event"] == "job" and local[-1] == {**there[-1]} and local[-1]["status"] == "done"
    results = json.loads((folder / RESULTS_FILE).read_text())
    assert results["status"] == "done" and results["trials"] == records
    # on this machine the cluster's folder is readable: every trial's checkpoint loads
    for record in records:
        assert read_checkpoint(record["checkpoint"]).step == 6000
        assert Path(record["checkpoint"]).is_relative_to(cluster_dir)
    assert "best: trial " in rest and "its checkpoint (on the cluster): " in rest


def test_stop_a_trial_and_the_job_then_resume_it_there(cluster, tmp_path):
    # a dataset of this machine's goes with the job (twice: the resumed job's too)
    rng = random.Random(5)
    names = sorted({"".join(rng.choice("abc") for _ in range(rng.randint(2, 8))) for _ in range(3000)})
    dataset = tmp_path / "abc.txt"
    dataset.write_text("\n".join(names) + "\n")
    folder = tmp_path / "stop"
    spec = STOP_SWEEP.replace("[run]\n", f"[run]\ndataset = '{dataset}'\n")
    run = Run(folder, cluster.env, write_spec(tmp_path, spec), address=cluster.job_address)
    job = run.until(lambda e: e["event"] == "job")["job"]
    first = run.until(lambda e: e["event"] == "trial_result")["trial"]
    run.process.stop(first)  # a small job appends the command to the sweep's commands.jsonl there
    assert run.until(lambda e: e["event"] == "trial_ended")["trial"] == first
    second = run.until(lambda e: e["event"] == "trial_result" and e.get("checkpoint"))["trial"]
    assert second != first
    run.process.stop()  # the job is stopped: Tune saves its state there
    assert run.finish() == 3
    assert run.events[-1]["event"] == "sweep_ended" and run.events[-1]["status"] == "stopped"
    ended = {e["trial"]: e["status"] for e in run.of("trial_ended")}
    assert ended == {first: "stopped", second: "stopped"}
    assert job_status(cluster, job) == "STOPPED"
    info = json.loads((folder / JOB_FILE).read_text())
    assert json.loads(Path(info["cluster_dir"], COMMANDS_FILE).read_text()) == {"stop": first}
    checkpoint = read_checkpoint(run.of("trial_ended", second)[0]["checkpoint"])
    saved = checkpoint.step
    assert 0 < saved < STOP_STEPS
    assert checkpoint.corpus.chars == ["a", "b", "c"] and set(checkpoint.corpus.docs) == set(names)

    again = Run(folder, cluster.env, resume=True)  # no address: where it ran (job.json)
    assert again.finish() == 0
    resubmitted = again.events[0]
    assert resubmitted["event"] == "job" and resubmitted["resumed"] and resubmitted["job"] != job
    new = again.events[again.events.index(next(e for e in again.events if e["event"] == "sweep")):]
    assert new[0]["resumed"] and new[0]["cluster_dir"] == info["cluster_dir"]
    started = [e["trial"] for e in new if e["event"] == "trial_started"]
    assert first not in started and second in started and len(started) == 2
    resumed = [e for e in new if e["event"] == "trial_result" and e["trial"] == second]
    assert resumed[0]["first_step"] == saved and resumed[-1]["step"] == STOP_STEPS
    assert read_checkpoint(again.of("trial_ended", second)[-1]["checkpoint"]).corpus.chars == ["a", "b", "c"]
    results = json.loads((folder / RESULTS_FILE).read_text())
    assert results["status"] == "done"
    assert sorted(t["status"] for t in results["trials"]) == ["done", "done", "stopped"]
    # the local events.jsonl: the first run's events once (the resumed runner's replay is not written again)
    local = read_events(folder / EVENTS_FILE)
    assert [e["event"] for e in local].count("trial_started") == 2 + 2
    assert job_status(cluster, resubmitted["job"]) == "SUCCEEDED"


def test_a_job_server_out_of_reach_a_refused_token_and_a_bad_address_are_one_line(cluster, tmp_path):
    spec = write_spec(tmp_path, JOB_SWEEP)
    port = free_port()
    gone = sweep_cli(cluster.env, str(spec), "--address", f"http://127.0.0.1:{port}", "--dir", str(tmp_path / "a"),
                     timeout=120)
    assert gone.returncode == 1
    assert gone.stderr.startswith(f"error: cannot reach the Ray job server at http://127.0.0.1:{port}: nothing "
                                  "listens there. Start the cluster's head with its job server")
    (tmp_path / "other").mkdir()
    wrong = ray_environment(tmp_path / "other")
    refused = sweep_cli(wrong, str(spec), "--address", cluster.job_address, "--dir", str(tmp_path / "b"), timeout=120)
    assert refused.returncode == 1
    assert f"error: the Ray job server at {cluster.job_address} refused this sweep's token: " in refused.stderr
    bad = sweep_cli(cluster.env, str(spec), "--address", "ray://127.0.0.1:10001", timeout=60)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith("error: --address 'ray://127.0.0.1:10001': Ray Client (ray://) addresses are not "
                                 "used; give http://HEAD:8265")


def test_ending_the_cluster_leaves_no_process(cluster):
    assert cluster.processes()
    started = time.monotonic()
    assert cluster.stop() == []
    assert time.monotonic() - started < 60
