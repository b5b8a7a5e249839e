"""The automatic backend choice ("auto"): the fastest backend available here
for a model's size and batch size, from measured speeds (engine.backends.speeds:
the table shipped with the engine, and this machine's own `bench` figures,
which win).

"auto" is never a Backend of its own: a caller resolves it with choose_backend
before opening one, and trains on Choice.now. When the fastest backend's
library is not built yet (a Futhark backend's first use compiles C for tens
of seconds), Choice.now is the fastest backend that is built (NumPy at
worst), and engine.backends.prebuild.start_build builds the other in the
background for the next run.

The rule, for a model of P parameters trained on B documents per step: every
measured (preset, batch, kind of CPU) point is at distance |ln(p/P)| +
|ln(b/B)| from it, plus ln 8 where its kind of CPU (speeds.cpu_kind: AVX-512 or
AVX2 on x86-64) is not this machine's (which backend is fastest turns on the
vector unit: with AVX-512, NumPy's BLAS multiplies 16 floats at a time, the
Futhark C as clang compiles it 8); the nearest point at which at least two of
the available backends were measured decides (else the nearest with one; of two
as near, the newer), and there the backend with the lowest ms/step wins.
Available backends without a figure there are named in the reason; so is a
backend left out because its last build failed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

from ..config import ModelConfig, TrainConfig
from . import prebuild
from .speeds import SHIPPED_SOURCE, Speed, all_speeds, this_cpu

AUTO = "auto"
DEFAULT_BACKEND = "numpy"  # with no figures at all: it runs everywhere and needs no build
NAMES_VOCAB = 27  # names.txt's vocabulary: the shipped table's parameter counts are at it
# A figure from another kind of CPU counts as far as one from a model 8 times larger or
# smaller: farther than the next preset (they are 5 to 6 times apart), nearer than a
# figure at batch 32 for a model trained at batch 1 (32 times).
OTHER_CPU_DISTANCE = math.log(8)


@dataclass(frozen=True)
class Choice:
    """What "auto" resolved to for one model and batch size."""
    backend: str   # the fastest available backend here
    reason: str    # "5.3 ms/step at s256 against numpy's 11.3; measured 2026-12-02, shipped table"
    built: bool    # False: backend's library must be built first (a Futhark backend's first use)
    now: str       # what to train on now: backend when built, else the fastest backend that is
    estimate: str = ""  # not built: how long its build usually takes ("about 20-40 s")
    ranking: tuple[str, ...] = field(default=(), compare=False)  # the compared backends, fastest first

    @property
    def label(self) -> str:
        """"auto: futhark-multicore", for a backend box or a status line."""
        return f"{AUTO}: {self.backend}"

    def text(self) -> str:
        """"auto: futhark-multicore (5.3 ms/step at s256 against numpy's 11.3; measured ...)"."""
        return f"{self.label} ({self.reason})"

    def meanwhile(self) -> str:
        """Why a run trains on another backend than the chosen one ("" when it does not)."""
        if self.now == self.backend:
            return ""
        return (f"{self.backend} is not built yet (its first use compiles C, {self.estimate}): "
                f"training on {self.now} meanwhile while it builds in the background")


def _names(available) -> list[str]:
    """Backend names from BackendInfo rows (the available ones) or from plain names."""
    names = []
    for item in available:
        if isinstance(item, str):
            names.append(item)
        elif getattr(item, "available", False):
            names.append(item.name)
    return names


def _distance(speed: Speed, params: int, batch: int, cpu: str) -> float:
    other = OTHER_CPU_DISTANCE if speed.cpu != cpu else 0.0
    return abs(math.log(speed.params / params)) + abs(math.log(speed.batch / batch)) + other


def _figure(ms: float) -> str:
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def _where(point: Speed, batch: int) -> str:
    """"s256", or "s256, batch 32" where a batch is involved."""
    return point.preset + (f", batch {point.batch}" if point.batch != 1 or batch != 1 else "")


def _nearest_note(point: Speed, params: int, batch: int) -> str:
    """When the model is not the measured point: what it is, after a colon."""
    if point.params == params and point.batch == batch:
        return ""
    model = f"{params / 1e6:.2g}M parameters" if params >= 1e6 else f"{params:,} parameters"
    return f": the measured point nearest this model, {model} at batch {batch}"


def _sources(speeds: list[Speed], cpu: str) -> str:
    """"measured 2026-12-02, shipped table", or "measured 2026-12-03, bench here; 2026-12-02, shipped table";
    a shipped figure of another kind of CPU says so ("..., shipped table, on x86-64 AVX2 (this CPU: arm64)")."""
    labels = []
    for s in speeds:
        label = f"{s.date[:10]}, shipped table" if s.source == SHIPPED_SOURCE else f"{s.date[:10]}, bench here"
        if s.cpu and s.cpu != cpu:
            label += f", on {s.cpu} (this CPU: {cpu})"
        if label not in labels:
            labels.append(label)
    return "measured " + "; ".join(labels)


def rank(speeds: Iterable[Speed], backends: list[str], params: int, batch: int, cpu: str = "") -> list[Speed]:
    """The figures at the nearest measured point (the module's rule) for this kind of CPU,
    fastest first; [] if none."""
    mine = [s for s in speeds if s.backend in backends]
    points: dict[tuple[str, int, str], list[Speed]] = {}
    for s in mine:
        points.setdefault((s.preset, s.batch, s.cpu), []).append(s)
    if not points:
        return []

    def nearness(key):
        rows = points[key]
        return (len({s.backend for s in rows}) < 2, min(_distance(s, params, batch, cpu) for s in rows))

    # min keeps the first of equals: the newest figures
    newest_first = sorted(points, key=lambda key: (max(s.date for s in points[key]), key), reverse=True)
    rows = points[min(newest_first, key=nearness)]
    return sorted(rows, key=lambda s: (s.ms_per_step, s.backend))


def choose_backend(model: ModelConfig, train: TrainConfig, available=None, *, vocab_size: int = NAMES_VOCAB,
                   speeds: list[Speed] | None = None, cpu: str | None = None) -> Choice:
    """The fastest of `available` (engine.backends.list_backends() rows, or names;
    default: every backend that can run here) for this model and batch size, from
    `speeds` (default: the shipped table and this machine's bench figures), with
    the reason and whether it is built yet. vocab_size: the dataset's, for the
    model's parameter count; cpu: this machine's kind of CPU (speeds.cpu_kind)."""
    if available is None:
        from . import list_backends

        available = list_backends()
    names = _names(available)
    failed = {}
    for name in names:
        for target in prebuild.library_targets(name, model, train, vocab_size):
            if why := prebuild.last_failure(target):
                failed[name] = why
                break
    names = [n for n in names if n not in failed]
    if not names:
        raise ValueError("no backend can run here" + "".join(f"; {n}: {why}" for n, why in failed.items()))
    params, batch = model.num_params(vocab_size), train.batch_size
    cpu = this_cpu() if cpu is None else cpu
    ranked = rank(all_speeds(cpu=cpu) if speeds is None else speeds, names, params, batch, cpu)
    if ranked:
        best, others = ranked[0], ranked[1:]
        reason = f"{_figure(best.ms_per_step)} ms/step at {_where(best, batch)}"
        if others:
            reason += " against " + " and ".join(f"{s.backend}'s {_figure(s.ms_per_step)}" for s in others)
        else:
            reason += ", the only backend here measured there"
        reason += f"{_nearest_note(best, params, batch)}; {_sources(ranked, cpu)}"
        unmeasured = [n for n in names if n not in {s.backend for s in ranked}]
        if unmeasured:
            reason += f"; not measured there: {', '.join(unmeasured)} (microgpt-gui bench measures them)"
        backend, order = best.backend, [s.backend for s in ranked]
    else:
        backend = DEFAULT_BACKEND if DEFAULT_BACKEND in names else names[0]
        reason = (f"no measured speeds for {', '.join(names)}; {backend} by default "
                  "(microgpt-gui bench measures them)")
        order = [backend]
    for name, why in failed.items():
        reason += f"; {name} left out: its last build failed: {why}"
    built = prebuild.is_built(backend, model, train, vocab_size)
    now, estimate = backend, ""
    if not built:
        ready = [n for n in order + names if prebuild.is_built(n, model, train, vocab_size)]
        now = ready[0] if ready else DEFAULT_BACKEND
        targets = prebuild.unbuilt_targets(backend, model, train, vocab_size)
        estimate = prebuild.build_estimate(*targets) if targets else ""
    return Choice(backend, reason, built, now, estimate, tuple(order))


@dataclass
class AutoStart:
    """"auto" resolved for one run: the choice, and the build started for the next run."""
    choice: Choice
    build: "prebuild.BackgroundBuild | None"

    @property
    def backend(self) -> str:
        """The backend to open for this run."""
        return self.choice.now

    def lines(self) -> list[str]:
        """What a front end says: the choice, and while its library builds, what trains meanwhile."""
        lines = [self.choice.text()]
        if self.choice.now != self.choice.backend:
            text = self.choice.meanwhile()
            if self.build is not None and self.build.log is not None:
                text += f" (log: {self.build.log})"
            lines.append(text + f"; the next run uses {self.choice.backend}")
        return lines


def resolve_auto(model: ModelConfig, train: TrainConfig, vocab_size: int = NAMES_VOCAB, available=None,
                 on_built=None) -> AutoStart:
    """choose_backend, and when the chosen backend is not built yet, its build started
    in the background (prebuild.start_build; on_built(BuildOutcome) is called from a
    watcher thread when it ends). Train this run on AutoStart.backend."""
    choice = choose_backend(model, train, available, vocab_size=vocab_size)
    build = None
    if not choice.built:
        build = prebuild.start_build(choice.backend, model, train, vocab_size, on_done=on_built)
    return AutoStart(choice, build)
