"""A finished sweep's figures, from its folder's events.jsonl (docs/sweeps.md):
its wall time, Ray's start, each trial's time outside training and
evaluation (Ray's overhead: the trial's process and actor, reports,
checkpoints, the backend's opening), trials per minute, the best trial.

    python scripts/sweep_figures.py SWEEP_DIR [SWEEP_DIR ...]
"""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the engine of this checkout

from engine.sweep.events import EVENTS_FILE, SweepTable, read_events  # noqa: E402


def figures(folder: Path) -> dict:
    events = read_events(folder / EVENTS_FILE)
    table = SweepTable()
    for event in events:
        table.apply(event)
    sweep = next(e for e in events if e["event"] == "sweep")
    end = next(e for e in reversed(events) if e["event"] == "sweep_ended")
    started = {e["trial"]: e["time"] for e in events if e["event"] == "trial_started"}
    ended = {e["trial"]: e["time"] for e in events if e["event"] == "trial_ended"}
    last = {}
    for e in events:
        if e["event"] == "trial_result":
            last[e["trial"]] = e
    outside = []
    for trial, t0 in started.items():
        if trial in ended and trial in last:
            r = last[trial]
            outside.append(ended[trial] - t0 - r["train_seconds"] - (r.get("eval_seconds") or 0.0))
    trials_s = end["time"] - sweep["time"]
    best = table.best()
    return {
        "folder": str(folder), "nodes": sweep.get("nodes"), "cpus": sweep.get("cpus"),
        "ray_start_s": sweep["time"], "wall_s": end["time"], "trials_s": trials_s, "trials": len(started),
        "trials_per_min": 60 * len(ended) / trials_s if trials_s > 0 else math.nan,
        "train_s": sum(r["train_seconds"] for r in last.values()),
        "eval_s": sum(r.get("eval_seconds") or 0.0 for r in last.values()),
        "outside_median_s": statistics.median(outside) if outside else math.nan,
        "outside_max_s": max(outside, default=math.nan),
        "statuses": {s: sum(1 for t in table.trials.values() if t.status.value == s)
                     for s in sorted({t.status.value for t in table.trials.values()})},
        "best": best and (best.trial, round(best.best_heldout, 4), best.settings, best.step),
    }


def main(argv: list[str]) -> int:
    for folder in argv:
        f = figures(Path(folder))
        print(f"{f['folder']}: {f['trials']} trials on {f['cpus']} CPUs, {f['nodes']} node(s); "
              f"wall {f['wall_s']:.1f} s (Ray started in {f['ray_start_s']:.1f} s, trials {f['trials_s']:.1f} s, "
              f"{f['trials_per_min']:.1f} trials/min); training {f['train_s']:.1f} s, evaluation {f['eval_s']:.1f} s "
              f"in all; per trial outside both: median {f['outside_median_s']:.2f} s, max {f['outside_max_s']:.2f} s; "
              f"{f['statuses']}; best {f['best']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
