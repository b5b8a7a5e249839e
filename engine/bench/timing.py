"""One bench configuration timed in this process (engine.bench.measure runs it in a
child process of its own; see its docstring), in the training loop every front
end uses (engine.training.loop): after warm-up, the steps run
as chunked `backend.train(k)` calls (the call the window makes) until both
at least `steps` steps and at least `seconds` seconds are done, in about ten
chunks; the figure is the median of the chunks' ms/step, with the fastest
and slowest chunk beside it. The 1-minute load average is read before and
after: above the core count, other work shared the CPU and the row says the
machine was busy. Also the row (BenchResult) and the budget (Budget) every
bench caller shares.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..backends import open_backend
from ..config import get_preset
from ..data.corpus import Corpus
from ..training import protocol as rs
from ..training.loop import LoopSettings, TrainingLoop
from ..training.protocol import RunSpec
from ..training.run_model import Phase

TORCH = "torch"
WARMUP_S = 0.3  # warm-up when its steps are not given: at least this long, and 3 steps
MEASURE_S = 2.0  # measure at least this long...
MEASURE_STEPS = 20  # ...and at least this many steps, whichever takes longer
SAMPLE_NAMES = 10  # names drawn in the timed sample() call
CHUNKS = 10  # the measured steps run in about this many train(k) calls


@dataclass(frozen=True)
class Budget:
    """How much of one configuration to measure."""

    steps: int = MEASURE_STEPS  # at least this many measured steps
    seconds: float = MEASURE_S  # and at least this many measured seconds (0: steps only)
    warmup: int | None = None  # warm-up steps; None: at least 3 and WARMUP_S seconds
    sample_names: int = SAMPLE_NAMES  # names in the timed backend.sample() call; 0: none

    def __post_init__(self) -> None:
        if self.steps < 1 or self.seconds < 0 or (self.warmup or 0) < 0 or self.sample_names < 0:
            raise ValueError(f"a bench budget needs steps >= 1 and no negative values, got {self}")


@dataclass
class BenchResult:
    backend: str
    preset: str
    status: str  # "ok", "skipped", "error" or "cancelled"
    reason: str = ""
    params: int = 0
    ms_per_step: float = 0.0  # median of the chunks
    ms_min: float = 0.0  # fastest chunk
    ms_max: float = 0.0  # slowest chunk
    steps_per_s: float = 0.0
    peak_rss_mb: float = 0.0
    steps: int = 0  # measured steps
    seconds: float = 0.0  # measured time (warm-up and sampling excluded)
    chunks: int = 0
    warmup: int = 0
    sample_names: int = 0
    sample_ms: float | None = None  # one sample(sample_names) call after the steps; None: not measured
    load_avg: float | None = None  # 1-minute load average, the higher of before and after
    cores: int = 0
    busy: bool = False  # load_avg above cores: other work shared the CPU
    runs_ms: list[float] = field(default_factory=list)  # every round's ms/step
    batch: int = 1  # documents per step
    names_per_s: float = 0.0  # documents trained on per second (steps/s x batch)
    # `bench --to-loss` (engine.bench.to_loss): training until the held-out loss reaches target_loss
    target_loss: float | None = None
    reached: bool = False  # an evaluation found the held-out loss at or below target_loss
    train_s: float = 0.0  # training seconds until then (evaluation excluded)
    eval_s: float = 0.0  # seconds the held-out evaluations took, apart
    evals: int = 0
    names_seen: int = 0
    epochs: float = 0.0
    heldout_loss: float | None = None  # the last evaluation's


# one configuration, in this process ----------------------------------------

def peak_rss_mb() -> float:
    """This process's resident-set high-water mark, in MiB.

    Linux: VmHWM, which starts afresh at exec (ru_maxrss would carry over the
    parent's peak from before the fork). Elsewhere: ru_maxrss, or NaN.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    try:
        import resource
    except ImportError:  # Windows: no getrusage
        return float("nan")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def load_average() -> float | None:
    """The 1-minute load average (None where the OS has none, e.g. Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def row_load(load_before: float | None, cores: int) -> tuple[float | None, bool]:
    """A row's load average, the larger of its start's and now's (None where there is
    none), and whether it exceeded the core count: the row is busy."""
    loads = [x for x in (load_before, load_average()) if x is not None]
    load = max(loads) if loads else None
    return load, load is not None and load > cores


def _open(backend: str, preset, corpus: Corpus):
    """A runner for the preset: an engine backend, or the PyTorch reference."""
    if backend == TORCH:
        from .torch_reference import TorchReference

        return TorchReference(preset.model, preset.train, corpus)
    return open_backend(backend, preset.model, preset.train, corpus)


class TimingPlan:
    """The timing loop as a TrainingLoop chunk plan (engine.training.loop): the warm-up
    one step per call, then the measured train(k) calls, then (when asked) one timed
    sample() call. It is also the loop's emit: each chunk's (steps, seconds) comes
    from its Losses event, timed by the loop around the train(k) call alone."""

    def __init__(self, budget: Budget, clock=time.perf_counter):
        self.budget, self.clock = budget, clock
        self.least_warmup = 3 if budget.warmup is None else budget.warmup
        self.warmup, self.warmup_seconds = 0, 0.0  # steps and seconds of the warm-up calls
        self.chunks: list[tuple[int, float]] = []  # each measured call's (steps, seconds)
        self.params = 0
        self.sample_ms: float | None = None
        self.error: BaseException | None = None
        self._sample_started: float | None = None
        self.loop: TrainingLoop | None = None

    @property
    def warming_up(self) -> bool:
        return self.warmup < self.least_warmup or (self.budget.warmup is None and self.warmup_seconds < WARMUP_S)

    @property
    def pace(self) -> float | None:
        """Seconds per step so far: the measured calls', else the warm-up's."""
        done, elapsed = self._measured()
        if done:
            return elapsed / done
        return self.warmup_seconds / self.warmup if self.warmup else None

    def _measured(self) -> tuple[int, float]:
        return sum(steps for steps, _ in self.chunks), sum(seconds for _, seconds in self.chunks)

    def next_chunk(self, loop=None) -> int:
        """One step while warming up; then k aims at about CHUNKS calls in all, from the
        pace so far, until at least budget.steps steps and budget.seconds seconds are
        done (once the time is met, the last call stops at budget.steps); then 0: done."""
        if self.warming_up:
            return 1
        budget, pace = self.budget, self.pace
        done, elapsed = self._measured()
        if done >= budget.steps and elapsed >= budget.seconds:
            return 0
        k = math.ceil(budget.steps / CHUNKS)
        if pace:
            k = max(k, math.ceil(budget.seconds / pace / CHUNKS))
        if elapsed >= budget.seconds:
            k = min(k, budget.steps - done)
        return k

    def __call__(self, event) -> None:
        if isinstance(event, rs.Opened):
            self.params = int(event.info.num_params)
        elif isinstance(event, rs.Losses):
            if self.warming_up:
                self.warmup += len(event.losses)
                self.warmup_seconds += event.seconds
            else:
                self.chunks.append((len(event.losses), event.seconds))
        elif isinstance(event, rs.PhaseChanged) and event.phase == Phase.DONE:
            self._sample(event)
        elif isinstance(event, rs.Samples) and self._sample_started is not None:
            self.sample_ms = 1e3 * (self.clock() - self._sample_started)
        elif isinstance(event, rs.Error) and self.error is None:
            self.error = event.exception or RuntimeError(event.message)

    def _sample(self, event) -> None:
        loop = self.loop
        if self.budget.sample_names and hasattr(loop.backend, "sample") and self.error is None:
            self._sample_started = self.clock()
            loop.send(rs.Sample(self.budget.sample_names, 0.5, 0))

    def run(self, spec: RunSpec, opener) -> "TimingPlan":
        """Time the runner opener(spec) gives in a TrainingLoop in this thread; raise what failed."""
        settings = LoopSettings(end_when_finished=True, heldout=False, chunk_steps=self.next_chunk,
                                opener=opener, clock=self.clock)
        self.loop = TrainingLoop(spec, self, settings)
        self.loop.run()
        if self.error is not None:
            raise self.error
        return self


def with_batch(preset, batch: int):
    return replace(preset, train=replace(preset.train, batch_size=batch))


def measure(backend: str, preset_name: str, corpus: Corpus, budget: Budget = Budget(),
            batch: int = 1) -> BenchResult:
    """Time one configuration in this process (see the module's docstring)."""
    cores, load_before = os.cpu_count() or 1, load_average()
    # num_steps only sets the learning-rate decay (and the loss history's length):
    # far enough for the steps the budget may run even at 50,000 steps/s
    horizon = 100_000 + budget.steps + (budget.warmup or 0) + int(budget.seconds * 50_000)
    preset = with_batch(get_preset(preset_name).with_steps(horizon), batch)
    plan = TimingPlan(budget).run(RunSpec(backend, corpus, preset.model, preset.train),
                                  lambda spec: _open(backend, preset, corpus))
    chunks = plan.chunks
    per_step = [1e3 * seconds / steps for steps, seconds in chunks]
    ms = statistics.median(per_step)
    load, busy = row_load(load_before, cores)
    return BenchResult(backend, preset_name, "ok", params=plan.params,
                       ms_per_step=ms, ms_min=min(per_step), ms_max=max(per_step),
                       steps_per_s=1e3 / ms, peak_rss_mb=peak_rss_mb(),
                       steps=sum(s for s, _ in chunks), seconds=sum(t for _, t in chunks),
                       chunks=len(chunks), warmup=plan.warmup, sample_names=budget.sample_names,
                       sample_ms=plan.sample_ms, load_avg=load, cores=cores, busy=busy, batch=batch,
                       names_per_s=1e3 * batch / ms)
