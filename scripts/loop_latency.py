"""Measure whether another busy Python thread stretches the training loop's work.

    python scripts/loop_latency.py [--backend numpy] [--preset tiny] [--repeats 10]

The training loop (engine.training.loop) runs in a thread of its own, as the
window runs it, while the main thread waits without holding the GIL (idle),
while a second Python thread spins in a tight loop (busy: a GUI thread with
work to do, or a test harness polling), or while another process spins
(cpu: the same load on the CPU, without the GIL: the control). For each:

- evaluation: the held-out evaluations of a training run (the loop's own
  timing of each, HoldoutSchedule.last_eval_seconds), after a warm-up; the
  NumPy backend evaluates in a child process of its own;
- evaluation here: the same, the NumPy backend evaluating in this process
  (as it did before the child: the comparison under the same load);
- resume: from Pause to the first Losses event after Resume;
- resume in evaluation: Stop, and Resume once the stopped run's held-out
  evaluation is under way (the command cancels it), to the first Losses.

Targets (issue 29): the same evaluation time busy as idle (on a machine
with cores to spare; on two cores, busy as cpu); each resume within 0.2 s
at tiny.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dev_data import DEFAULT_DATA  # noqa: E402  (beside this script)

from engine import get_preset, load_corpus  # noqa: E402
from engine.training import protocol as rs  # noqa: E402
from engine.training.loop import LoopSettings, TrainingLoop, open_runner  # noqa: E402
from engine.training.run_model import Phase  # noqa: E402

TIMEOUT_S = 120.0


CONDITIONS = ("idle", "busy", "cpu")


@contextmanager
def load(condition: str):
    """While the block runs: nothing else (idle), a second Python thread of this
    process spinning (busy), or a spinning process (cpu: the same load on the
    CPU without the GIL, the control: what is left of busy's cost is the CPU's)."""
    stop = threading.Event()

    def spin():
        count = 0
        while not stop.is_set():
            count += 1

    spinner = threading.Thread(target=spin, name="spinner", daemon=True) if condition == "busy" else None
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if condition == "cpu" else None
    if spinner:
        spinner.start()
    try:
        yield
    finally:
        stop.set()
        if spinner:
            spinner.join()
        if process:
            process.kill()
            process.wait()


class Run:
    """A TrainingLoop in its own thread, with its events time-stamped as they come."""

    def __init__(self, spec: rs.RunSpec, settings: LoopSettings):
        self.events: list[tuple[float, rs.Event]] = []
        self.eval_seconds: list[float] = []
        self._changed = threading.Condition()
        self.loop = TrainingLoop(spec, self._emit, settings)
        self.thread = threading.Thread(target=self.loop.run, name="training-loop", daemon=True)
        self.thread.start()

    def _emit(self, event: rs.Event) -> None:
        now = time.perf_counter()
        if isinstance(event, rs.Heldout) and not event.replacing:
            self.eval_seconds.append(self.loop.holdout_schedule.last_eval_seconds)
        with self._changed:
            self.events.append((now, event))
            self._changed.notify_all()

    def first_after(self, index: int, predicate) -> tuple[float, rs.Event]:
        """The first (time, event) from the index-th event on for which predicate(event) holds."""
        def found():
            return next((te for te in self.events[index:] if predicate(te[1])), None)

        with self._changed:
            if not self._changed.wait_for(found, TIMEOUT_S):
                raise SystemExit("timed out waiting for the training loop")
            return found()

    def mark(self) -> int:
        with self._changed:
            return len(self.events)

    def end(self) -> None:
        self.loop.send(rs.End(serve_saves=False))
        self.thread.join(TIMEOUT_S)


def is_phase(phase):
    return lambda e: isinstance(e, rs.PhaseChanged) and e.phase == phase


def measure_evaluations(spec: rs.RunSpec, count: int, in_child: bool = True) -> list[float]:
    """Seconds of `count` held-out evaluations (after one uncounted), the loop
    evaluating whenever its schedule allows with the share at its largest; the
    NumPy backend's in its child process, or (in_child False) in this one, as before."""
    def opener(s):
        backend = open_runner(s)
        backend.heldout_in_child = in_child
        return backend

    run = Run(spec, LoopSettings(heldout_share=1.0, delay_first_evaluation=False, opener=opener))
    with run._changed:
        run._changed.wait_for(lambda: len(run.eval_seconds) > count, TIMEOUT_S)
    run.end()
    return run.eval_seconds[1 : count + 1]


def measure_resumes(spec: rs.RunSpec, count: int, during_evaluation: bool) -> list[float]:
    """Seconds from Resume to the first Losses after it, `count` times: after a
    Pause, or after a Stop once the stopped run's held-out evaluation is under way
    (a Stop whose evaluation ended before it was seen is not counted)."""
    run = Run(spec, LoopSettings())
    run.first_after(0, lambda e: isinstance(e, rs.Losses))
    time.sleep(0.3)  # the chunk at its length
    latencies = []
    for _ in range(20 * count):
        if len(latencies) == count:
            break
        index = run.mark()
        run.loop.send(rs.Stop() if during_evaluation else rs.Pause())
        run.first_after(index, is_phase(Phase.DONE if during_evaluation else Phase.PAUSED))
        if during_evaluation and not in_evaluation(run, index):
            run.loop.send(rs.Resume())
            time.sleep(0.2)
            continue
        if not during_evaluation:
            time.sleep(0.1)
        index = run.mark()
        sent = time.perf_counter()
        run.loop.send(rs.Resume())
        arrived, _ = run.first_after(index, lambda e: isinstance(e, rs.Losses))
        latencies.append(arrived - sent)
        time.sleep(0.2)  # train a while: the next Stop has steps to evaluate
    run.end()
    return latencies


def in_evaluation(run: Run, index: int) -> bool:
    """Wait until the stopped run's held-out evaluation is under way (True), or
    over already (False: its Heldout event came)."""
    deadline = time.monotonic() + TIMEOUT_S
    while run.loop.call != "evaluating the held-out loss":
        with run._changed:
            if any(isinstance(e, rs.Heldout) for _, e in run.events[index:]):
                return False
        if time.monotonic() > deadline:
            raise SystemExit("the stopped run's evaluation never started")
        time.sleep(0.0005)
    time.sleep(0.002)  # well inside it
    return True


def summary(seconds: list[float]) -> str:
    ms = [1e3 * s for s in seconds]
    return f"median {statistics.median(ms):8.1f} ms   max {max(ms):8.1f} ms   (n={len(ms)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--backend", default="numpy")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--repeats", type=int, default=10, help="measurements per condition")
    parser.add_argument("--only", action="append", choices=["evaluation", "evaluation here", "resume",
                                                             "resume in evaluation"],
                        help="measure only this (repeat it for more)")
    parser.add_argument("--rounds", type=int, default=1, help="turns the idle and busy conditions take")
    args = parser.parse_args()
    preset = get_preset(args.preset).with_steps(10**9)
    corpus = load_corpus(args.data)
    spec = rs.RunSpec(args.backend, corpus, preset.model, replace(preset.train))
    print(f"{args.backend} at {args.preset}; Python {sys.version.split()[0]}, switch interval "
          f"{1e3 * sys.getswitchinterval():g} ms, {os.cpu_count()} cores")
    measures = (("evaluation", lambda: measure_evaluations(spec, args.repeats)),
                ("evaluation here", lambda: measure_evaluations(spec, args.repeats, in_child=False)),
                ("resume", lambda: measure_resumes(spec, args.repeats, False)),
                ("resume in evaluation", lambda: measure_resumes(spec, args.repeats, True)))
    chosen = [(what, measure) for what, measure in measures if args.only is None or what in args.only]
    samples: dict[tuple[str, str], list[float]] = {}
    for condition in CONDITIONS * args.rounds:  # the measures take turns under each condition
        with load(condition):
            for what, measure in chosen:
                figures = measure()
                samples.setdefault((what, condition), []).extend(figures)
                print(f"{what:21s} {condition:4s}  {summary(figures)}", flush=True)
    if args.rounds > 1:
        print("all rounds:")
        for (what, condition), figures in samples.items():
            print(f"{what:21s} {condition:4s}  {summary(figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
