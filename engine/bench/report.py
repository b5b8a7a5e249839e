"""What `microgpt-gui bench` prints and writes: the table, its legend, the
busy-machine warning, the machine's description and the JSON file."""
from __future__ import annotations

import datetime
import json
import os
import platform
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .measure import torch_status
from .timing import CHUNKS, BenchResult, Budget

_COLUMNS = "{:<17} {:<11} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>5} {:>5} {:>8} {:>5}"  # 17: futhark-multicore


def table_header() -> str:
    return _COLUMNS.format("backend", "preset", "params", "ms/step", "min", "max", "steps/s",
                           "sample ms", "peak MB", "steps", "s", "batch", "names/s", "load")


def is_busy(r: BenchResult) -> bool:
    """A measured row that ran while the load average exceeded the core count
    (other work shared the CPU): bench's table, its warning and the window's
    Scaling study all flag rows by this."""
    return r.status == "ok" and r.busy


def status_text(r: BenchResult) -> str:
    """"ok", "busy (load 3.1 on 2 cores)", or the status and the reason it has no figures."""
    if r.status != "ok":
        return f"{r.status}: {r.reason}"
    return f"busy (load {r.load_avg:.1f} on {r.cores} cores)" if is_busy(r) else "ok"


def table_row(r: BenchResult) -> str:
    if r.status != "ok":
        batch = f" (batch {r.batch})" if r.batch != 1 else ""
        return f"{r.backend:<17} {r.preset:<11} {status_text(r)}{batch}"
    row = _COLUMNS.format(r.backend, r.preset, f"{r.params:,}", f"{r.ms_per_step:.3f}", f"{r.ms_min:.3f}",
                          f"{r.ms_max:.3f}", f"{r.steps_per_s:.1f}",
                          "-" if r.sample_ms is None else f"{r.sample_ms:.1f}", f"{r.peak_rss_mb:.0f}",
                          r.steps, f"{r.seconds:.1f}", r.batch, f"{r.names_per_s:,.0f}",
                          "-" if r.load_avg is None else f"{r.load_avg:.1f}")
    return row + (" busy" if is_busy(r) else "")


# `bench --to-loss`: time to a held-out loss
_LOSS_COLUMNS = "{:<17} {:<11} {:>5} {:>11} {:>7} {:>8} {:>7} {:>9} {:>10} {:>6} {:>8} {:>8} {:>5}"


def to_loss_header() -> str:
    return _LOSS_COLUMNS.format("backend", "preset", "batch", "params", "reached", "train s", "eval s",
                                "steps", "names seen", "epochs", "held-out", "names/s", "load")


def to_loss_row(r: BenchResult) -> str:
    if r.status != "ok":
        return table_row(r)
    row = _LOSS_COLUMNS.format(r.backend, r.preset, r.batch, f"{r.params:,}", "yes" if r.reached else "no",
                               f"{r.train_s:.1f}", f"{r.eval_s:.1f}", r.steps, f"{r.names_seen:,}",
                               f"{r.epochs:.2f}", "-" if r.heldout_loss is None else f"{r.heldout_loss:.4f}",
                               f"{r.names_per_s:,.0f}", "-" if r.load_avg is None else f"{r.load_avg:.1f}")
    return row + (" busy" if r.busy else "")


def to_loss_legend(target: float, time_limit: float) -> str:
    return (f"training until the held-out loss is at most {target:g} (evaluated between train(k) calls) or "
            f"{time_limit:g} s of training; train s: the train(k) calls only; eval s: the evaluations, apart; "
            "each run is the preset's own (its steps set the learning-rate decay)")


def legend(budget: Budget) -> str:
    samples = f"one sample({budget.sample_names}) call after the steps" if budget.sample_names else "not measured"
    return (f"ms/step: median of about {CHUNKS} train(k) calls after warm-up, at least {budget.steps} steps "
            f"and {budget.seconds:g} s (min, max: the fastest and slowest call); sample ms: {samples}; "
            "load: 1-minute load average")


def busy_note(results: list[BenchResult]) -> str:
    """A warning when any row ran while the load average exceeded the core count, else ""."""
    measured = [r for r in results if r.status == "ok"]
    busy = [r for r in measured if is_busy(r)]
    if not busy:
        return ""
    worst = max(busy, key=lambda r: r.load_avg)
    return (f"warning: the machine was busy during {len(busy)} of {len(measured)} rows (marked busy; "
            f"load average up to {worst.load_avg:.1f} on {worst.cores} cores): other work shared the CPU, "
            "so those figures are slower and noisier than this machine can do; measure again when it is idle")


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
    from ..backends.speeds import this_cpu

    info = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cpu_kind": this_cpu(),  # what the automatic choice's figures are keyed by
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
