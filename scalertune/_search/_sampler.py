"""The sampler of a study: Optuna's TPE, with the dtype kept to the space's choices."""

from __future__ import annotations

import random
import warnings
from typing import Any

import optuna

from scalertune._storage._trial_record import Retry


class DtypeSampler(optuna.samplers.BaseSampler):
    """Optuna's TPE sampler, with ``dtype`` held to the search space's choices.

    ``dtype``'s distribution spans all three dtypes, because the float32 references are runs
    of the study too; TPE is asked as usual (jointly, or one parameter at a time), and a dtype
    outside the space (float32) is asked again, then drawn uniformly from the space's choices.
    """

    def __init__(self, dtypes: list[str], *, seed: int | None) -> None:
        self._seed = seed
        self._base = _tpe(seed)
        self._dtypes = list(dtypes)
        self._rng = random.Random(seed)

    def infer_relative_search_space(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, Any]:
        return self._base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, search_space: dict[str, Any]
    ) -> dict[str, Any]:
        for _ in range(8):
            params = self._base.sample_relative(study, trial, search_space)
            if params.get("dtype", self._dtypes[0]) in self._dtypes:
                return params
        # Leave dtype to sample_independent, which keeps to the space's choices.
        return {k: v for k, v in params.items() if k != "dtype"}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        param_name: str,
        param_distribution: Any,
    ) -> Any:
        if param_name != "dtype":
            return self._base.sample_independent(study, trial, param_name, param_distribution)
        if len(self._dtypes) == 1:
            return self._dtypes[0]
        for _ in range(8):
            value = self._base.sample_independent(study, trial, param_name, param_distribution)
            if value in self._dtypes:
                return value
        return self._rng.choice(self._dtypes)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if self._seed is not None:
            # Each trial draws from its own stream, seeded by the study's seed and its number:
            # workers that share a study (and its seed) sample different configs instead of
            # the same sequence side by side, and one worker's search stays reproducible.
            seed = (self._seed * 1_000_003 + _ordinal(study, trial)) % 2**32
            self._base, self._rng = _tpe(seed), random.Random(seed)
        self._base.before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        state: optuna.trial.TrialState,
        values: Any,
    ) -> None:
        self._base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self._base.reseed_rng()


def _ordinal(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> int:
    """``trial``'s number less the retries queued before it: a run that lost its evidence
    to a fault (a host gone, a worker killed) is queued again as a new trial, and without
    this every trial sampled after it would draw from another stream than in the undisturbed
    search, so that the answer would depend on when the fault hit."""
    retries = sum(
        1
        for other in study.get_trials(deepcopy=False)
        if other.number < trial.number and Retry.sound(other).retry_history
    )
    return trial.number - retries


def _tpe(seed: int | None) -> optuna.samplers.TPESampler:
    """TPE as Optuna advises for several workers: a running trial counts as a bad result
    (``constant_liar``), so that workers do not all sample next to the same good one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
