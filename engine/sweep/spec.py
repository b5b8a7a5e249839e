"""A sweep file: the search space over a run's fields, the search algorithm,
the early-stopping scheduler, the budget and the resources per trial, as a
small TOML file, read and checked here (Qt-free and Ray-free, so the window
and the command line check a sweep before anything starts).

    [sweep]
    name = "quick"
    search = "random"            # grid, random or tpe (Optuna's TPE)
    trials = 4                   # samples (grid: how many times the grid runs)
    time_budget_s = 60           # optional: the sweep ends after this many seconds
    seed = 0                     # optional: the search's own seed (reproducible sampling)

    [resources]
    cpus_per_trial = 1           # one BLAS or Futhark thread per CPU a trial holds
    cpus = 2                     # a local Ray's CPUs (default: every core here)

    [scheduler]
    kind = "asha"                # asha (early stopping on the held-out loss) or none
    time_attr = "names_seen"     # names_seen or train_seconds
    grace = 2000                 # names (seconds) every trial trains before its first cut
    reduction_factor = 2

    [run]                        # every trial's fixed settings: a preset, then fields over it
    preset = "tiny"
    backend = "numpy"
    steps = 300

    [space]                      # sampled fields
    learning_rate = { loguniform = [0.003, 0.03] }
    n_embd = { choice = [16, 32] }

Every error is a SweepSpecError whose message names the table and key.
"""
from __future__ import annotations

import enum
import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from ..config import FIELD_LIMITS, PRESETS, ModelConfig, TrainConfig, get_preset


class SweepSpecError(ValueError):
    """A sweep file that cannot run, with what is wrong and where."""


class Search(str, enum.Enum):
    GRID = "grid"
    RANDOM = "random"
    TPE = "tpe"  # Optuna's tree-structured Parzen estimator, through Tune's OptunaSearch


class TimeAttr(str, enum.Enum):
    """What ASHA measures a trial's progress in."""

    NAMES_SEEN = "names_seen"
    TRAIN_SECONDS = "train_seconds"


# The run fields a sweep can set, with their types and (for numbers) the
# engine.config.FIELD_LIMITS key that bounds them.
FIELDS: dict[str, tuple[type, str | None]] = {
    "preset": (str, None), "backend": (str, None),
    "n_embd": (int, "model.n_embd"), "n_layer": (int, "model.n_layer"), "n_head": (int, "model.n_head"),
    "block_size": (int, "model.block_size"),
    "learning_rate": (float, "train.learning_rate"), "init_std": (float, "train.init_std"),
    "batch_size": (int, "train.batch_size"), "warmup_steps": (int, "train.warmup_steps"),
    "steps": (int, "train.num_steps"), "seed": (int, "train.seed"), "holdout": (int, "train.holdout"),
}
MODEL_FIELDS = ("n_embd", "n_layer", "n_head", "block_size")
TRAIN_FIELDS = {"learning_rate": "learning_rate", "init_std": "init_std", "batch_size": "batch_size",
                "warmup_steps": "warmup_steps", "steps": "num_steps", "seed": "seed", "holdout": "holdout"}

LISTS = ("choice", "grid")           # a list of values: sampled, or every one (Tune's grid_search)
RANGES = ("uniform", "loguniform", "int", "logint")  # [low, high]; int ranges include high
KINDS = LISTS + RANGES

DEFAULT_REPORT_S = 0.5        # a trial reports to Tune about this often (one chunk of training)
DEFAULT_CHECKPOINT_S = 60.0   # ...and checkpoints at most this often, besides ASHA's rungs and its end
DEFAULT_RUNGS = 3             # ASHA's cuts when no grace is given: max_t / reduction_factor^3 first


@dataclass(frozen=True)
class Domain:
    """One field's values: a list (choice, grid) or a range [low, high]."""

    kind: str
    values: tuple

    @property
    def is_list(self) -> bool:
        return self.kind in LISTS

    def largest(self) -> float:
        return max(self.values)

    def describe(self) -> str:
        if self.is_list:
            return f"{self.kind} of {', '.join(map(str, self.values))}"
        return f"{self.kind} {self.values[0]:g}..{self.values[1]:g}"


@dataclass(frozen=True)
class Scheduler:
    kind: str = "asha"  # "asha" or "none"
    time_attr: TimeAttr = TimeAttr.NAMES_SEEN
    grace: float | None = None            # None: max_t / reduction_factor^DEFAULT_RUNGS
    reduction_factor: float = 2.0
    max_t: float | None = None            # None: the longest trial's names, or the time budget

    def grace_for(self, max_t: float) -> float:
        return self.grace if self.grace is not None else max(1.0, max_t / self.reduction_factor ** DEFAULT_RUNGS)


@dataclass(frozen=True)
class SweepSpec:
    name: str
    search: Search = Search.RANDOM
    trials: int = 1
    time_budget_s: float | None = None
    seed: int | None = None
    max_concurrent: int | None = None
    cpus_per_trial: int = 1
    cpus: int | None = None                      # a local Ray's CPUs; None: every core
    scheduler: Scheduler = field(default_factory=Scheduler)
    run: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))     # field -> value
    space: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))   # field -> Domain
    dataset: str | None = None                   # a text file; None: the packaged names.txt
    report_every_s: float = DEFAULT_REPORT_S
    checkpoint_every_s: float = DEFAULT_CHECKPOINT_S
    source: str = ""                             # the TOML text it was read from

    @property
    def metric(self) -> str:
        return "heldout_loss"

    def max_t(self) -> float:
        """ASHA's horizon in time_attr units: the given one, else the longest trial's names
        (its steps x batch, at their largest), else the time budget."""
        s = self.scheduler
        if s.max_t is not None:
            return s.max_t
        if s.time_attr == TimeAttr.TRAIN_SECONDS:
            return float(self.time_budget_s)  # checked present when the spec was read
        return float(self.largest("steps") * self.largest("batch_size"))

    def largest(self, name: str) -> float:
        """A numeric field's largest value over the space (its preset's where unset)."""
        if name in self.space:
            return self.space[name].largest()
        if name in self.run:
            return self.run[name]
        presets = self.space["preset"].values if "preset" in self.space else (self.run.get("preset", "tiny"),)
        return max(_preset_value(get_preset(p), name) for p in presets)

    def checkpoint_milestones(self) -> tuple[float, ...]:
        """ASHA's rungs (grace x reduction_factor^k below max_t), where a trial
        checkpoints so that one stopped there can be loaded where it stopped."""
        if self.scheduler.kind != "asha":
            return ()
        max_t = self.max_t()
        rungs, t = [], self.scheduler.grace_for(max_t)
        while t < max_t:
            rungs.append(t)
            t *= self.scheduler.reduction_factor
        return tuple(rungs)


def _preset_value(preset, name: str):
    if name in MODEL_FIELDS:
        return getattr(preset.model, name)
    return getattr(preset.train, TRAIN_FIELDS[name])


def run_configs(settings: dict) -> tuple[str, ModelConfig, TrainConfig]:
    """A trial's (backend, model, train) from its settings (a [run] table merged with a
    sample of [space]): the preset's configs with the fields over them. ValueError
    (engine.config's message) for a combination that is no run, e.g. n_embd 24 with
    n_head 5."""
    preset = get_preset(settings.get("preset", "tiny"))
    model = replace(preset.model, **{k: settings[k] for k in MODEL_FIELDS if k in settings})
    train = replace(preset.train, **{TRAIN_FIELDS[k]: settings[k] for k in TRAIN_FIELDS if k in settings})
    return settings.get("backend", "numpy"), model, train


# ---- reading -------------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "sweeps"  # package data


def examples() -> list[str]:
    """The shipped example sweeps' names (quick, ...)."""
    return sorted(p.stem for p in EXAMPLES.glob("*.toml"))


def find_spec_file(name: str | Path) -> Path:
    """A sweep file by path, or a shipped example by name ("quick" or "quick.toml")
    where no such file exists."""
    path = Path(name)
    if path.exists() or path.parent != Path("."):
        return path
    example = EXAMPLES / (path.name if path.suffix == ".toml" else f"{path.name}.toml")
    return example if example.is_file() else path

def read_spec(path: str | Path) -> SweepSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SweepSpecError(f"{path}: no such file (the shipped examples: {', '.join(examples())})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SweepSpecError(f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        return parse_spec(text, default_name=path.stem)
    except SweepSpecError as exc:
        raise SweepSpecError(f"{path}: {exc}") from None


TABLES = {
    "sweep": {"name", "search", "trials", "time_budget_s", "seed", "max_concurrent", "report_every_s",
              "checkpoint_every_s"},
    "resources": {"cpus_per_trial", "cpus"},
    "scheduler": {"kind", "time_attr", "grace", "reduction_factor", "max_t"},
    "run": set(FIELDS) | {"dataset"},
    "space": set(FIELDS),
}


def parse_spec(text: str, default_name: str = "sweep", backend_names=None) -> SweepSpec:
    """The spec in `text` (TOML), checked. backend_names: the names a backend may have
    (default: the engine's registry)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SweepSpecError(f"not valid TOML: {exc}") from None
    _check_keys(data, TABLES, "")
    for table in TABLES:
        if table in data and not isinstance(data[table], dict):
            raise SweepSpecError(f"[{table}] must be a table")
    sweep = data.get("sweep", {})
    resources = data.get("resources", {})
    names = _backend_names() if backend_names is None else tuple(backend_names)

    name = _text(sweep, "sweep", "name", default_name)
    if not name.strip() or any(c in name for c in "/\\\0"):
        raise SweepSpecError(f"[sweep] name must be a non-empty name without slashes, got {name!r}")
    search = _enum(sweep, "sweep", "search", Search, Search.RANDOM)
    trials = _whole(sweep, "sweep", "trials", 1, least=1, most=100_000)
    budget = _number(sweep, "sweep", "time_budget_s", None, positive=True)
    seed = _whole(sweep, "sweep", "seed", None, least=0, most=2**31 - 1)
    concurrent = _whole(sweep, "sweep", "max_concurrent", None, least=1, most=10_000)
    report_s = _number(sweep, "sweep", "report_every_s", DEFAULT_REPORT_S, positive=True)
    checkpoint_s = _number(sweep, "sweep", "checkpoint_every_s", DEFAULT_CHECKPOINT_S, positive=True)
    cpus_per_trial = _whole(resources, "resources", "cpus_per_trial", 1, least=1, most=1024)
    cpus = _whole(resources, "resources", "cpus", None, least=1, most=100_000)
    if cpus is not None and cpus < cpus_per_trial:
        raise SweepSpecError(f"[resources] cpus ({cpus}) is less than cpus_per_trial ({cpus_per_trial}): "
                             "no trial could run")

    run_table = dict(data.get("run", {}))
    dataset = run_table.pop("dataset", None)
    if dataset is not None and (not isinstance(dataset, str) or not dataset.strip()):
        raise SweepSpecError(f"[run] dataset must be a file name, got {dataset!r}")
    run = {key: _value(value, key, "run", names) for key, value in run_table.items()}
    space = {key: _domain(value, key, names) for key, value in data.get("space", {}).items()}
    both = sorted(set(run) & set(space))
    if both:
        raise SweepSpecError(f"{', '.join(both)} is in both [run] and [space]: fix it in one or sample it")

    scheduler = _scheduler(data.get("scheduler", {}))
    spec = SweepSpec(name=name, search=search, trials=trials, time_budget_s=budget, seed=seed,
                     max_concurrent=concurrent, cpus_per_trial=cpus_per_trial, cpus=cpus, scheduler=scheduler,
                     run=MappingProxyType(run), space=MappingProxyType(space), dataset=dataset,
                     report_every_s=report_s, checkpoint_every_s=checkpoint_s, source=text)
    _check_search(spec)
    _check_scheduler(spec)
    _check_some_run(spec)
    return spec


def _backend_names() -> tuple[str, ...]:
    from ..backends import backend_names

    return backend_names()


def _check_keys(data: dict, allowed: dict, where: str) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise SweepSpecError(f"unknown table [{unknown[0]}]; the tables are {', '.join(f'[{t}]' for t in allowed)}")
    for table, keys in allowed.items():
        extra = sorted(set(data.get(table, {}) if isinstance(data.get(table), dict) else ()) - keys)
        if extra:
            raise SweepSpecError(f"[{table}] has no key {extra[0]!r}; it takes {', '.join(sorted(keys))}")


def _text(table: dict, where: str, key: str, default: str) -> str:
    value = table.get(key, default)
    if not isinstance(value, str):
        raise SweepSpecError(f"[{where}] {key} must be text, got {value!r}")
    return value


def _enum(table: dict, where: str, key: str, kind, default):
    value = table.get(key, default)
    try:
        return kind(value)
    except ValueError:
        raise SweepSpecError(f"[{where}] {key} must be one of {', '.join(repr(k.value) for k in kind)}, "
                             f"got {value!r}") from None


def _whole(table: dict, where: str, key: str, default, least: int, most: int):
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SweepSpecError(f"[{where}] {key} must be a whole number, got {value!r}")
    if not least <= value <= most:
        raise SweepSpecError(f"[{where}] {key} must be from {least:,} to {most:,}, got {value:,}")
    return value


def _number(table: dict, where: str, key: str, default, positive: bool):
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SweepSpecError(f"[{where}] {key} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise SweepSpecError(f"[{where}] {key} must be positive, got {value:g}")
    return float(value)


def _value(value, key: str, where: str, backend_names) -> object:
    """One value of a run field, checked against its type and the window's limits."""
    kind, limit = FIELDS[key]
    label = f"[{where}] {key}"
    if kind is str:
        if not isinstance(value, str):
            raise SweepSpecError(f"{label} must be a name, got {value!r}")
        if key == "preset" and value not in PRESETS:
            raise SweepSpecError(f"{label}: unknown preset {value!r}; choose from {', '.join(PRESETS)}")
        if key == "backend" and value not in backend_names:
            raise SweepSpecError(f"{label}: unknown backend {value!r}; choose from {', '.join(backend_names)}")
        return value
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise SweepSpecError(f"{label} must be a whole number, got {value!r}")
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SweepSpecError(f"{label} must be a finite number, got {value!r}")
        value = float(value)
    low, high = FIELD_LIMITS[limit]
    if not low <= value <= high:
        raise SweepSpecError(f"{label} must be from {low:g} to {high:g}, got {value:g}")
    return value


def _domain(value, key: str, backend_names) -> Domain:
    label = f"[space] {key}"
    if not isinstance(value, dict) or len(value) != 1:
        raise SweepSpecError(f"{label} must be one of {{ {' | '.join(f'{k} = [...]' for k in KINDS)} }}, "
                             f"got {value!r} (a fixed value goes in [run])")
    (kind, values), = value.items()
    if kind not in KINDS:
        raise SweepSpecError(f"{label}: unknown kind {kind!r}; use one of {', '.join(KINDS)}")
    if not isinstance(values, list) or not values:
        raise SweepSpecError(f"{label}: {kind} needs a non-empty list, got {values!r}")
    if kind in LISTS:
        checked = tuple(_value(v, key, "space", backend_names) for v in values)
        if len(set(checked)) != len(checked):
            raise SweepSpecError(f"{label}: {kind} lists a value twice")
        return Domain(kind, checked)
    field_type = FIELDS[key][0]
    if field_type is str:
        raise SweepSpecError(f"{label}: {key} is a name: use choice or grid, not a range")
    if len(values) != 2:
        raise SweepSpecError(f"{label}: {kind} needs [low, high], got {values!r}")
    if kind in ("int", "logint") and field_type is not int:
        raise SweepSpecError(f"{label}: {key} is not a whole number: use uniform or loguniform")
    low, high = (_value(v, key, "space", backend_names) for v in values)
    if field_type is int:
        low, high = int(low), int(high)  # a range of a whole-number field stays whole
    if not low < high:
        raise SweepSpecError(f"{label}: {kind} needs low < high, got [{low:g}, {high:g}]")
    if kind.startswith("log") and low <= 0:
        raise SweepSpecError(f"{label}: {kind} needs low > 0, got {low:g}")
    return Domain(kind, (low, high))


def _scheduler(table: dict) -> Scheduler:
    kind = table.get("kind", "asha")
    if kind not in ("asha", "none"):
        raise SweepSpecError(f"[scheduler] kind must be 'asha' or 'none', got {kind!r}")
    rf = _number(table, "scheduler", "reduction_factor", 2.0, positive=True)
    if rf <= 1:
        raise SweepSpecError(f"[scheduler] reduction_factor must be more than 1, got {rf:g}")
    return Scheduler(kind=kind, time_attr=_enum(table, "scheduler", "time_attr", TimeAttr, TimeAttr.NAMES_SEEN),
                     grace=_number(table, "scheduler", "grace", None, positive=True), reduction_factor=rf,
                     max_t=_number(table, "scheduler", "max_t", None, positive=True))


def _check_search(spec: SweepSpec) -> None:
    if spec.search == Search.GRID:
        ranges = [key for key, d in spec.space.items() if not d.is_list]
        if ranges:
            raise SweepSpecError(f"[space] {ranges[0]} is a {spec.space[ranges[0]].kind} range: "
                                 "grid search needs lists (grid or choice)")
    if spec.search == Search.TPE:
        grids = [key for key, d in spec.space.items() if d.kind == "grid"]
        if grids:
            raise SweepSpecError(f"[space] {grids[0]} is a grid: TPE samples its space (use choice)")
        if not spec.space:
            raise SweepSpecError("[space] is empty: TPE needs at least one field to search")


def _check_scheduler(spec: SweepSpec) -> None:
    s = spec.scheduler
    if s.kind != "asha":
        return
    if s.time_attr == TimeAttr.TRAIN_SECONDS and s.max_t is None and spec.time_budget_s is None:
        raise SweepSpecError("[scheduler] max_t (seconds) is needed with time_attr = 'train_seconds' "
                             "when [sweep] has no time_budget_s")
    max_t = spec.max_t()
    if s.grace is not None and s.grace > max_t:
        unit = "names" if s.time_attr == TimeAttr.NAMES_SEEN else "seconds"
        raise SweepSpecError(f"[scheduler] grace ({s.grace:g} {unit}) is past the longest trial "
                             f"({max_t:g} {unit}): no trial would ever be cut")


def _check_some_run(spec: SweepSpec) -> None:
    """The [run] values and every list's values together must make a run (a sampled
    range is checked per trial); e.g. n_embd 24 with n_head 5 is refused here."""
    fixed = dict(spec.run)
    for key, domain in spec.space.items():
        fixed[key] = domain.values[0]
    try:
        run_configs(fixed)
    except ValueError as exc:
        raise SweepSpecError(f"the first trial would not run: {exc}") from None
    holdouts = spec.space["holdout"].values if "holdout" in spec.space else (spec.run.get("holdout"),)
    if 0 in holdouts:
        raise SweepSpecError("holdout 0: a sweep compares trials by their held-out loss, "
                             "so some documents must be held out")


def space_size(spec: SweepSpec) -> int | None:
    """Trials a grid search runs (the product of its lists times trials); None for sampling."""
    if spec.search != Search.GRID:
        return None
    size = spec.trials
    for domain in spec.space.values():
        size *= len(domain.values)
    return size
