"""A SweepSpec in Ray Tune's terms: the search space, the search algorithm
(Tune's random and grid variants, or Optuna's TPE through OptunaSearch) and
the scheduler (ASHA on the held-out loss). Imported by the runner only: it
imports Ray.
"""
from __future__ import annotations

from typing import Callable

from ray import tune
from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, TrialScheduler
from ray.tune.search import BasicVariantGenerator

from .spec import Domain, Search, SweepSpec


def tune_domain(domain: Domain):
    low_high = domain.values
    if domain.kind == "choice":
        return tune.choice(list(domain.values))
    if domain.kind == "grid":
        return tune.grid_search(list(domain.values))
    if domain.kind == "uniform":
        return tune.uniform(*low_high)
    if domain.kind == "loguniform":
        return tune.loguniform(*low_high)
    if domain.kind == "int":       # the spec's ranges include high; Tune's exclude it
        return tune.randint(low_high[0], low_high[1] + 1)
    if domain.kind == "logint":
        return tune.lograndint(low_high[0], low_high[1] + 1)
    raise ValueError(f"unknown domain kind {domain.kind!r}")


def param_space(spec: SweepSpec) -> dict:
    """The sampled fields only: the fixed [run] fields reach trials through TrialBase."""
    return {key: tune_domain(domain) for key, domain in spec.space.items()}


def search_algorithm(spec: SweepSpec):
    if spec.search == Search.TPE:
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return OptunaSearch(sampler=optuna.samplers.TPESampler(seed=spec.seed))  # Tune limits it (max_concurrent)
    # random sampling and grids (grid_search values) alike; reproducible with a seed. Tune
    # ignores max_concurrent_trials for a generator it is given: it takes the limit itself.
    return BasicVariantGenerator(random_state=spec.seed, max_concurrent=spec.max_concurrent or 0)


class ReportingASHA(AsyncHyperBandScheduler):
    """ASHA that tells on_cut(trial_id) when it stops a trial that had not finished, so
    the trial table can say "stopped early" rather than "stopped". on_cut is looked up
    at call time (CUT_LISTENER), not pickled with the scheduler's saved state."""

    def on_trial_result(self, tune_controller, trial, result) -> str:
        action = super().on_trial_result(tune_controller, trial, result)
        if action == TrialScheduler.STOP and not result.get("finished") and CUT_LISTENER:
            CUT_LISTENER[0](trial.trial_id)
        return action


CUT_LISTENER: list[Callable[[str], None]] = []  # the runner's, set once per process


def scheduler(spec: SweepSpec):
    s = spec.scheduler
    if s.kind != "asha":
        return FIFOScheduler()
    max_t = spec.max_t()
    return ReportingASHA(time_attr=s.time_attr.value, max_t=max_t, grace_period=s.grace_for(max_t),
                         reduction_factor=s.reduction_factor)
