"""The benchmark behind `microgpt-gui bench`: ms/step (median, min, max),
steps/s, sampling time and peak memory per (backend, preset).

Each configuration runs in a fresh Python process (`python -m engine.bench
SPEC`), so its peak RSS is its own and not the largest seen so far; a
Measurement is that process, which a caller can poll and cancel (the CLI
waits on it; a window can poll it from a timer). Timing: after warm-up, the
steps run as chunked `backend.train(k)` calls (the call the window makes)
until both at least `steps` steps and at least `seconds` seconds are done,
in about ten chunks; the figure is the median of the chunks' ms/step, with
the fastest and slowest chunk beside it. The 1-minute load average is read
before and after: above the core count, other work shared the CPU and the
row says the machine was busy. `torch` is PyTorch's CPU build doing the same
step the usual way (engine.torch_reference), measured when PyTorch is
importable.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .backends import list_backends, open_backend
from .config import get_preset
from .data import Corpus
from .errors import Cancelled

TORCH = "torch"
WARMUP_S = 0.3  # warm-up when its steps are not given: at least this long, and 3 steps
MEASURE_S = 2.0  # measure at least this long...
MEASURE_STEPS = 20  # ...and at least this many steps, whichever takes longer
SAMPLE_NAMES = 10  # names drawn in the timed sample() call
CHUNKS = 10  # the measured steps run in about this many train(k) calls
POLL_S = 0.05  # how often Measurement.wait looks at the child and the cancel hook


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
    # `bench --to-loss` (engine.bench_loss): training until the held-out loss reaches target_loss
    target_loss: float | None = None
    reached: bool = False  # an evaluation found the held-out loss at or below target_loss
    train_s: float = 0.0  # training seconds until then (evaluation excluded)
    eval_s: float = 0.0  # seconds the held-out evaluations took, apart
    evals: int = 0
    names_seen: int = 0
    epochs: float = 0.0
    heldout_loss: float | None = None  # the last evaluation's


# what may run here --------------------------------------------------------

def torch_status() -> tuple[bool, str]:
    """Whether PyTorch is installed, found without importing it: importing torch
    loads a gigabyte of libraries while holding the GIL (the Scaling study asks from
    a background thread, and the window stalled for 190 ms). The torch row runs in
    its own process, which imports it and reports a broken install as its error."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError) as exc:
        return False, f"PyTorch is not importable ({exc.__class__.__name__}: {exc})"
    if not found:
        return False, "PyTorch is not installed (pip install torch)"
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        version = "(version unknown)"
    return True, f"PyTorch {version} on the CPU"


def availability(names: list[str], with_torch: bool = True) -> dict[str, tuple[bool, str]]:
    """name -> (available, reason) for engine backends (and the torch reference
    when with_torch); ValueError for a name that is neither."""
    infos = {info.name: (info.available, info.reason) for info in list_backends()}
    out = {}
    for name in names:
        if name == TORCH and with_torch:
            out[name] = torch_status()
        elif name in infos:
            out[name] = infos[name]
        else:
            known = ", ".join([*infos, TORCH] if with_torch else infos)
            raise ValueError(f"unknown backend {name!r}; choose from {known}")
    return out


def default_backends() -> list[str]:
    return [info.name for info in list_backends()] + [TORCH]


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


def _warm_up(runner, warmup: int | None) -> tuple[int, float | None]:
    """Run the warm-up one step per call; (steps run, seconds per step or None)."""
    least = 3 if warmup is None else warmup
    start, done = time.perf_counter(), 0
    while done < least or (warmup is None and time.perf_counter() - start < WARMUP_S):
        runner.train(1)
        done += 1
    return done, (time.perf_counter() - start) / done if done else None


def _timed_chunks(runner, budget: Budget, pace: float | None) -> list[tuple[int, float]]:
    """(steps, seconds) of each train(k) call until at least budget.steps steps and
    budget.seconds seconds are done. k aims at about CHUNKS calls in all, from the
    pace so far; once the time is met, the last call stops at budget.steps."""
    chunks, done, elapsed = [], 0, 0.0
    while done < budget.steps or elapsed < budget.seconds:
        k = math.ceil(budget.steps / CHUNKS)
        if pace:
            k = max(k, math.ceil(budget.seconds / pace / CHUNKS))
        if elapsed >= budget.seconds:
            k = min(k, budget.steps - done)
        start = time.perf_counter()
        ran = len(runner.train(k))
        seconds = time.perf_counter() - start
        if ran == 0:  # the run's step horizon is reached (see measure): nothing more to time
            break
        chunks.append((ran, seconds))
        done, elapsed = done + ran, elapsed + seconds
        pace = elapsed / done
    return chunks


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
    runner = _open(backend, preset, corpus)
    try:
        warmup, pace = _warm_up(runner, budget.warmup)
        chunks = _timed_chunks(runner, budget, pace)
        sample_ms = None
        if budget.sample_names and hasattr(runner, "sample"):
            start = time.perf_counter()
            runner.sample(budget.sample_names, temperature=0.5, seed=0)
            sample_ms = 1e3 * (time.perf_counter() - start)
        per_step = [1e3 * seconds / steps for steps, seconds in chunks]
        ms = statistics.median(per_step)
        load, busy = row_load(load_before, cores)
        return BenchResult(backend, preset_name, "ok", params=int(runner.num_params),
                           ms_per_step=ms, ms_min=min(per_step), ms_max=max(per_step),
                           steps_per_s=1e3 / ms, peak_rss_mb=peak_rss_mb(),
                           steps=sum(s for s, _ in chunks), seconds=sum(t for _, t in chunks),
                           chunks=len(chunks), warmup=warmup, sample_names=budget.sample_names,
                           sample_ms=sample_ms, load_avg=load, cores=cores, busy=busy, batch=batch,
                           names_per_s=1e3 * batch / ms)
    finally:
        runner.close()


# one configuration in its own process ---------------------------------------

def _worker_env() -> dict[str, str]:
    """The child imports this very engine package, installed or not."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


class Measurement:
    """One (backend, preset) being measured in a child process, started at once.

    poll() returns None while it runs, then its BenchResult; wait(cancel)
    blocks until then, polling `cancel` every POLL_S seconds; cancel() kills
    the child, and on POSIX everything it started (a Futhark compile), at
    once. Used as a context manager, leaving the block cancels a measurement
    still running, so an exception or Ctrl+C never leaves a child behind.
    """

    def __init__(self, backend: str, preset: str, data: Path, budget: Budget = Budget(), batch: int = 1,
                 to_loss=None):
        self.backend, self.preset = backend, preset
        spec = {"backend": backend, "preset": preset, "data": str(data), **asdict(budget), "batch": batch,
                "to_loss": None if to_loss is None else asdict(to_loss)}
        # files, not pipes: a child writing a long error never blocks on a full pipe
        self._out = tempfile.TemporaryFile("w+", encoding="utf-8")
        self._err = tempfile.TemporaryFile("w+", encoding="utf-8")
        self._result: BenchResult | None = None
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "engine.bench", json.dumps(spec)], stdin=subprocess.DEVNULL,
            stdout=self._out, stderr=self._err, env=_worker_env(), start_new_session=os.name == "posix")

    def poll(self) -> BenchResult | None:
        if self._result is None and self._proc.poll() is not None:
            self._result = self._read()
        return self._result

    def wait(self, cancel=None) -> BenchResult:
        """The result, once the child ends. cancel, a zero-argument callable, is
        polled while it runs: when it returns True the child is killed and
        Cancelled is raised."""
        while self.poll() is None:
            if cancel is not None and cancel():
                self.cancel()
                raise Cancelled(f"measuring {self.backend} at {self.preset} was cancelled")
            try:
                self._proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
        return self._result

    def cancel(self) -> None:
        """Kill the child if it still runs; the result is then a "cancelled" row."""
        if self._proc.poll() is None:
            try:
                if os.name == "posix":
                    os.killpg(self._proc.pid, signal.SIGKILL)  # its own group (start_new_session)
                else:
                    self._proc.kill()
            except ProcessLookupError:  # it ended just now
                pass
            self._proc.wait()
            if self._result is None:
                self._result = BenchResult(self.backend, self.preset, "cancelled", reason="cancelled")
        self.poll()

    def __enter__(self) -> "Measurement":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()
        self._out.close()
        self._err.close()

    def _read(self) -> BenchResult:
        self._out.seek(0)
        self._err.seek(0)
        lines = self._out.read().strip().splitlines()
        if self._proc.returncode == 0 and lines:
            return BenchResult(**json.loads(lines[-1]))
        code = self._proc.returncode
        status = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        err = (self._err.read().strip().splitlines() or [status])[-1]
        return BenchResult(self.backend, self.preset, "error", reason=err)


def run_isolated(backend: str, preset: str, data: Path, budget: Budget = Budget(),
                 cancel=None, batch: int = 1, to_loss=None) -> BenchResult:
    """Measure one configuration in a fresh process and wait for its row;
    cancel (optional, polled every POLL_S s) ends it: Cancelled is raised.
    to_loss (an engine.bench_loss.ToLoss): train to a held-out loss instead of timing steps."""
    with Measurement(backend, preset, data, budget, batch, to_loss) as measurement:
        return measurement.wait(cancel)


# every configuration --------------------------------------------------------

def run_bench(backends: list[str], presets: list[str], data: Path, budget: Budget = Budget(),
              rounds: int = 1, on_row=lambda row: None, batches: list[int] | None = None,
              to_loss=None) -> list[BenchResult]:
    """Measure every (backend, preset, batch); on_row(BenchResult) is called as rows come in
    (first a "skipped" row for each backend that cannot run here, and one for
    each batch size a backend does not train).

    Backends take turns on each preset, `rounds` times, so a neighbour's load
    falls on all of them alike; a row is the run with the median ms/step,
    with the largest peak memory of its runs.
    """
    for name in presets:
        get_preset(name)  # unknown names fail before anything runs
    status = availability(backends)
    results = [BenchResult(b, "-", "skipped", reason=status[b][1]) for b in backends if not status[b][0]]
    for row in results:
        on_row(row)
    runnable = [b for b in backends if status[b][0]]
    for batch in batches or [None]:  # None: each preset's own batch size
        for preset in presets:
            size = get_preset(preset).train.batch_size if batch is None else batch
            runs: dict[str, list[BenchResult]] = {backend: [] for backend in runnable}
            for _ in range(rounds):
                for backend in runnable:
                    runs[backend].append(run_isolated(backend, preset, data, budget, batch=size,
                                                      to_loss=to_loss))
            for backend in runnable:
                results.append(median_run(runs[backend]))
                on_row(results[-1])
    return results


def median_run(runs: list[BenchResult]) -> BenchResult:
    """The run with the median ms/step, with the largest peak memory and load of all."""
    ok = sorted((r for r in runs if r.status == "ok"), key=lambda r: r.ms_per_step)
    if not ok:
        return runs[-1]
    loads = [r.load_avg for r in ok if r.load_avg is not None]
    row = replace(ok[(len(ok) - 1) // 2], peak_rss_mb=max(r.peak_rss_mb for r in ok),
                  load_avg=max(loads) if loads else None, busy=any(r.busy for r in ok))
    row.runs_ms = [round(r.ms_per_step, 4) for r in runs if r.status == "ok"]
    return row


# the child process ---------------------------------------------------------

def _worker(argv: list[str]) -> int:
    """Child process: measure the configuration in argv[0] (JSON, as Measurement
    writes it); print its result as one JSON line."""
    spec = json.loads(argv[0])
    backend, preset, data = spec.pop("backend"), spec.pop("preset"), spec.pop("data")
    batch, to_loss = spec.pop("batch", 1), spec.pop("to_loss", None)
    try:
        corpus = Corpus.from_file(data)
        if to_loss is not None:
            from .bench_loss import ToLoss, measure_to_loss

            result = measure_to_loss(backend, preset, corpus, ToLoss(**to_loss), batch)
        else:
            result = measure(backend, preset, corpus, Budget(**spec), batch)
    except Exception as exc:  # reported as this row's error, not a traceback
        result = BenchResult(backend, preset, "error", reason=f"{type(exc).__name__}: {exc}")
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
