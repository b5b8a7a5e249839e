"""A sweep submitted as a Ray job against the same sweep with its driver here,
on a local two-node cluster with its job server (docs/sweeps.md, Measured):
when the sweep's first event and first trial result arrive, the end-to-end
time, how late the relayed events come, and how long a job's Stop takes.

    python scripts/sweep_job_figures.py [ROUNDS]

The cluster is the tests' (tests/sweep_support.Cluster: one CPU a node, the
job server on 127.0.0.1, a token of its own) and is ended by its own
processes at the end.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # this checkout's engine, the tests' cluster

from sweep_support import Cluster, Run, four_trial_sweep, ray_environment, write_spec  # noqa: E402

SWEEP = four_trial_sweep("measure", report_every_s=0.5)
LONG = SWEEP.replace("steps = 6000", "steps = 400000").replace("trials = 4", "trials = 2")


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def timed_sweep(folder: Path, env: dict, spec: Path, address: str) -> str:
    started = time.monotonic()
    run = Run(folder, env, spec, address=address)
    first_sweep = first_result = None
    lag = []  # arrival here minus the event's own time (seconds since its runner began)
    while (event := run.next_event(600)) is not None:
        now = time.monotonic() - started
        first_sweep = now if event["event"] == "sweep" and first_sweep is None else first_sweep
        first_result = now if event["event"] == "trial_result" and first_result is None else first_result
        if event["event"] != "job":
            lag.append(now - event["time"])
    code = run.process.wait()
    text = (f"exit {code}, {len(run.of('trial_ended'))} trials: sweep event at {first_sweep:.1f} s, first result "
            f"at {first_result:.1f} s, end to end {time.monotonic() - started:.1f} s")
    late = sorted(x - min(lag) for x in lag)
    return text + (f"; events later than the quickest: median {statistics.median(late):.2f} s, "
                   f"max {late[-1]:.2f} s ({len(late)} events)")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    root = Path(tempfile.mkdtemp(prefix="sweep-job-figures-"))
    env = ray_environment(root, MICROGPT_GUI_DATA_DIR=str(root / "cluster-data"))
    cluster = Cluster(env, job_server=True)
    started = time.monotonic()
    cluster.start()
    print(f"cluster started in {time.monotonic() - started:.1f} s (load {load()})")
    spec, long = write_spec(root, SWEEP, "measure.toml"), write_spec(root, LONG, "long.toml")
    try:
        for n in range(rounds):
            for kind, address in (("job", cluster.job_address), ("driver here", cluster.address)):
                before = load()
                print(f"round {n}, {kind}: {timed_sweep(root / f'{n}-{kind}', env, spec, address)} "
                      f"(load {before} to {load()})")
        for n in range(rounds):
            run = Run(root / f"stop-{n}", env, long, address=cluster.job_address)
            run.until(lambda e: e["event"] == "trial_result")
            stopped = time.monotonic()
            run.process.stop()
            code = run.finish()
            print(f"job stop {n}: exit {code} after {time.monotonic() - stopped:.1f} s, trials "
                  f"{[e['status'] for e in run.of('trial_ended')]}")
    finally:
        started = time.monotonic()
        left = cluster.stop()
        print(f"cluster ended in {time.monotonic() - started:.1f} s; processes left: {left}")


if __name__ == "__main__":
    main()
