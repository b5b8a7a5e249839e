"""The benchmark behind `microgpt-gui bench`: ms/step (median, min, max),
steps/s, sampling time and peak memory per (backend, preset).

Each configuration runs in a fresh Python process (`python -m engine.bench.measure
SPEC`), so its peak RSS is its own and not the largest seen so far; a
Measurement is that process, which a caller can poll and cancel (the CLI
waits on it; a window can poll it from a timer). The child times it with
engine.bench.timing.measure (the timing loop and the row, BenchResult).
`torch` is PyTorch's CPU build doing the same step the usual way
(engine.bench.torch_reference), measured when PyTorch is importable.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from ..backends import backend_names, list_backends
from .timing import TORCH, BenchResult, Budget, measure
from ..config import get_preset
from ..data.corpus import Corpus
from ..errors import Cancelled

POLL_S = 0.05  # how often Measurement.wait looks at the child and the cancel hook


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
    """Every backend's name and the torch reference's, probing none (a probe can take
    tens of ms: the scaling study's dialog lists them on the GUI thread)."""
    return [*backend_names(), TORCH]


# one configuration in its own process ---------------------------------------

def _worker_env() -> dict[str, str]:
    """The child imports this very engine package, installed or not."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # the folder holding engine/
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
            [sys.executable, "-m", "engine.bench.measure", json.dumps(spec)], stdin=subprocess.DEVNULL,
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
    to_loss (an engine.bench.to_loss.ToLoss): train to a held-out loss instead of timing steps."""
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
            from .to_loss import ToLoss, measure_to_loss

            result = measure_to_loss(backend, preset, corpus, ToLoss(**to_loss), batch)
        else:
            result = measure(backend, preset, corpus, Budget(**spec), batch)
    except Exception as exc:  # reported as this row's error, not a traceback
        result = BenchResult(backend, preset, "error", reason=f"{type(exc).__name__}: {exc}")
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
