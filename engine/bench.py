"""The benchmark behind `microgpt-gui bench`: ms/step, steps/s and peak memory
per (backend, preset).

Each configuration runs in a fresh Python process (`python -m engine.bench
BACKEND PRESET ...`), so its peak RSS is its own and not the largest seen so
far. Timing: after warm-up, the measured steps run in up to ten chunks of
`backend.train(k)` (the call the window makes); the result is the median of
the chunks' ms/step, which shrugs off a neighbour stealing the CPU for a
moment. `torch` is PyTorch's CPU build doing the same step the usual way
(engine.torch_reference), measured when PyTorch is importable.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from .backends import list_backends, open_backend
from .config import get_preset
from .data import Corpus

TORCH = "torch"
AUTO_WARMUP_S = 0.3  # warm-up length when not given: at least this long (and 3 steps)
AUTO_MEASURE_S = 2.0  # measured length when not given (and at least MIN_AUTO_STEPS)
MIN_AUTO_STEPS = 20
MAX_CHUNKS = 10


@dataclass
class BenchResult:
    backend: str
    preset: str
    status: str  # "ok", "skipped" or "error"
    reason: str = ""
    params: int = 0
    ms_per_step: float = 0.0
    steps_per_s: float = 0.0
    peak_rss_mb: float = 0.0
    steps: int = 0
    warmup: int = 0
    runs_ms: list[float] = field(default_factory=list)  # every round's ms/step


# what may run here --------------------------------------------------------

def torch_status() -> tuple[bool, str]:
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install
        return False, f"PyTorch is not importable ({exc.__class__.__name__}: {exc})"
    return True, f"PyTorch {torch.__version__} on the CPU, {torch.get_num_threads()} threads"


def availability(names: list[str]) -> dict[str, tuple[bool, str]]:
    """name -> (available, reason) for engine backends and the torch reference."""
    infos = {info.name: (info.available, info.reason) for info in list_backends()}
    out = {}
    for name in names:
        if name == TORCH:
            out[name] = torch_status()
        elif name in infos:
            out[name] = infos[name]
        else:
            known = ", ".join([*infos, TORCH])
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


def _open(backend: str, preset, corpus: Corpus):
    if backend == TORCH:
        from .torch_reference import TorchReference

        return TorchReference(preset.model, preset.train, corpus)
    return open_backend(backend, preset.model, preset.train, corpus)


def _chunks(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def measure(backend: str, preset_name: str, corpus: Corpus, steps: int | None = None,
            warmup: int | None = None) -> BenchResult:
    """Time `steps` training steps after `warmup` steps (automatic lengths when None)."""
    # num_steps only sets the learning-rate decay; keep it well past the steps run here
    preset = get_preset(preset_name).with_steps(100_000 + (warmup or 0) + (steps or 0))
    runner = _open(backend, preset, corpus)
    try:
        least = 3 if warmup is None else max(warmup, 1 if steps is None else 0)  # 1 to pace auto steps
        start, done = time.perf_counter(), 0
        while done < least or (warmup is None and time.perf_counter() - start < AUTO_WARMUP_S):
            runner.train(1)
            done += 1
        warmup = done
        if steps is None:  # enough steps for about AUTO_MEASURE_S, from the warm-up's pace
            per_step = (time.perf_counter() - start) / max(done, 1)
            steps = int(min(max(AUTO_MEASURE_S / per_step, MIN_AUTO_STEPS), 50_000))
        times = []
        for k in _chunks(steps, min(MAX_CHUNKS, steps)):
            t0 = time.perf_counter()
            runner.train(k)
            times.append((time.perf_counter() - t0) / k)
        ms = 1e3 * statistics.median(times)
        return BenchResult(backend, preset_name, "ok", params=int(runner.num_params),
                           ms_per_step=ms, steps_per_s=1e3 / ms, peak_rss_mb=peak_rss_mb(),
                           steps=steps, warmup=warmup)
    finally:
        runner.close()


# every configuration, each in its own process -------------------------------

def _worker_env() -> dict[str, str]:
    """The child imports this very engine package, installed or not."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_isolated(backend: str, preset: str, data: Path, steps: int | None,
                 warmup: int | None) -> BenchResult:
    cmd = [sys.executable, "-m", "engine.bench", backend, preset, str(data),
           str(steps or 0), str(-1 if warmup is None else warmup)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_worker_env())
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return BenchResult(**json.loads(lines[-1]))
    err = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return BenchResult(backend, preset, "error", reason=err)


def run_bench(backends: list[str], presets: list[str], data: Path, steps: int | None = None,
              warmup: int | None = None, rounds: int = 1, report=print) -> list[BenchResult]:
    """Measure every (backend, preset); report(line) is called as rows come in.

    Backends take turns on each preset, `rounds` times, so a neighbour's load
    falls on all of them alike; a row is the run with the median ms/step,
    with the largest peak memory of its runs.
    """
    for name in presets:
        get_preset(name)  # unknown names fail before anything runs
    status = availability(backends)
    report(table_header())
    results = []
    for backend in backends:
        available, reason = status[backend]
        if not available:
            results.append(BenchResult(backend, "-", "skipped", reason=reason))
            report(table_row(results[-1]))
    runnable = [b for b in backends if status[b][0]]
    for preset in presets:
        runs: dict[str, list[BenchResult]] = {backend: [] for backend in runnable}
        for _ in range(rounds):
            for backend in runnable:
                runs[backend].append(run_isolated(backend, preset, data, steps, warmup))
        for backend in runnable:
            results.append(median_run(runs[backend]))
            report(table_row(results[-1]))
    return results


def median_run(runs: list[BenchResult]) -> BenchResult:
    ok = sorted((r for r in runs if r.status == "ok"), key=lambda r: r.ms_per_step)
    if not ok:
        return runs[-1]
    row = replace(ok[(len(ok) - 1) // 2], peak_rss_mb=max(r.peak_rss_mb for r in ok))
    row.runs_ms = [round(r.ms_per_step, 4) for r in runs if r.status == "ok"]
    return row


# output --------------------------------------------------------------------

_COLUMNS = "{:<17} {:<11} {:>12} {:>10} {:>10} {:>9} {:>7}"  # 17: futhark-multicore


def table_header() -> str:
    return _COLUMNS.format("backend", "preset", "params", "ms/step", "steps/s", "peak MB", "steps")


def table_row(r: BenchResult) -> str:
    if r.status != "ok":
        return f"{r.backend:<17} {r.preset:<11} {r.status}: {r.reason}"
    return _COLUMNS.format(r.backend, r.preset, f"{r.params:,}", f"{r.ms_per_step:.3f}",
                           f"{r.steps_per_s:.1f}", f"{r.peak_rss_mb:.0f}", r.steps)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numpy_blas() -> str:
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas['name']} {blas.get('version', '')}".strip()
    except Exception:  # older NumPy, or a build that does not say
        return "unknown"


def machine_info(with_torch: bool = True) -> dict:
    """Where the numbers come from (importing PyTorch takes seconds: only when asked)."""
    info = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numpy_blas": numpy_blas(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "openblas_env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS")},
    }
    if with_torch:
        available, _ = torch_status()
        if available:
            import torch

            info["torch"] = torch.__version__
            info["torch_threads"] = torch.get_num_threads()
    return info


def write_json(path: Path, results: list[BenchResult], command: list[str], machine: dict) -> None:
    doc = {"command": command, "machine": machine, "results": [asdict(r) for r in results]}
    Path(path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")


def _worker(argv: list[str]) -> int:
    """Child process: measure one configuration, print its result as one JSON line."""
    backend, preset, data, steps, warmup = argv
    try:
        result = measure(backend, preset, Corpus.from_file(data), int(steps) or None,
                         None if int(warmup) < 0 else int(warmup))
    except Exception as exc:  # reported as this row's error, not a traceback
        result = BenchResult(backend, preset, "error", reason=f"{type(exc).__name__}: {exc}")
    print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
