"""The sampler of a study: Optuna's TPE, with the dtype kept to the space's choices."""

from __future__ import annotations

import random
import warnings
from typing import Any

import optuna

from scalertune._storage._names import ROLE_SEARCH
from scalertune._storage._trial_record import Retry, role_of


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
    """``trial``'s number less the trials before it that a fault added: a run that lost its
    evidence (a host gone, a worker killed) is queued again as a new trial, and a failed
    attempt that is not queued again (a float32 reference, resumed from its checkpoint by
    the next attempt) leaves a trial behind. Without this every trial sampled after either
    would draw from another stream than in the undisturbed search, and the answer would
    depend on when the fault hit. A failed run whose copy is queued stays counted: the
    undisturbed search sampled it there too; and so does a sampled run that failed."""
    earlier = [t for t in study.get_trials(deepcopy=False) if t.number < trial.number]
    chains = [Retry.sound(t) for t in earlier]
    replayed = {c.failed_trial for c in chains if c.retry_history}
    added = sum(
        1
        for t, chain in zip(earlier, chains)
        if chain.retry_history  # a copy, queued again
        or (
            t.state == optuna.trial.TrialState.FAIL
            and t.number not in replayed
            # a sampled run that failed (its config raised) stays counted: with its number's
            # stream back, the next trial would sample the same config again
            and role_of(t) not in (ROLE_SEARCH, None)
        )
    )
    return trial.number - added


def _tpe(seed: int | None) -> optuna.samplers.TPESampler:
    """TPE as Optuna advises for several workers: a running trial counts as a bad result
    (``constant_liar``), so that workers do not all sample next to the same good one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
