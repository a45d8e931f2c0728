"""Runs as the study stores them: each finished trial as an Outcome, and the float32 references."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._errors import DamagedEvidence
from scalertune._judge._stored import check_trial, reference_data, sound
from scalertune._storage._names import (
    JUDGED_ATTR,
    LOSSES_ATTR,
    ROLE_BASELINE,
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_ISLAND,
    ROLE_REFERENCE,
    ROLE_REPLAY,
    ROLE_SEARCH,
    RUN_ROLES,
    SCALES_ATTR,
    TRACEBACK_ATTR,
)


def encode_scales(scales: Sequence[float]) -> list[list[float]]:
    runs: list[list[float]] = []
    for value in scales:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return runs


def decode_scales(runs: Sequence[Sequence[float]]) -> tuple[float, ...]:
    return tuple(value for value, count in runs for _ in range(int(count)))


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One finished run as the study stores it: a trial plus its judged attributes.

    A :class:`SearchResult` holds them (its ``ranking``, ``baselines``, ``recommended``,
    ``best_amp``); they are read from the study, not built by hand.

    Example:
        >>> result = scalertune.analyze(study)  # doctest: +SKIP
        >>> best = result.ranking[0]  # doctest: +SKIP
        >>> best.label, best.config.describe(), best.steps_to_target  # doctest: +SKIP
        ('#7', 'float16 scale=4096 growth=2 backoff=0.5 every 2000, no clip', 186)
    """

    number: int
    role: str
    config: AmpConfig
    seed: int
    state: str
    attrs: dict[str, Any]
    losses: tuple[float, ...]
    scales: tuple[float, ...] = ()

    @classmethod
    def from_trial(cls, trial: FrozenTrial) -> Outcome:
        """Read one finished run from its Optuna trial.

        Args:
            trial: A trial a search wrote (its ``config`` user attribute, the judged figures,
                the losses and the scales).

        Returns:
            The outcome.

        Raises:
            DamagedEvidence: The trial's attributes are not what a run stores (a study's
                storage is written by others too; see
                :func:`~scalertune._judge._stored.check_trial`): named in one line.

        Example:
            >>> outcomes = [Outcome.from_trial(t) for t in study.trials]  # doctest: +SKIP
        """
        check_trial(trial)
        # the judged figures in full precision over the rounded copies the dashboard shows
        attrs = {
            **trial.user_attrs,
            **trial.system_attrs.get(JUDGED_ATTR, {}),
            **(
                {"traceback": trial.system_attrs[TRACEBACK_ATTR]}
                if TRACEBACK_ATTR in trial.system_attrs
                else {}
            ),
        }
        return cls(
            number=trial.number,
            role=attrs.get("role", ROLE_SEARCH),
            config=AmpConfig.from_dict(attrs["config"]),
            seed=int(attrs.get("seed", 0)),
            state=trial.state.name.lower(),
            attrs=attrs,
            losses=tuple(trial.system_attrs.get(LOSSES_ATTR, ())),
            scales=decode_scales(trial.system_attrs.get(SCALES_ATTR, [])),
        )

    @property
    def label(self) -> str:
        if self.role == ROLE_BASELINE:
            return str(self.attrs["baseline"])
        if self.role == ROLE_CONFIRM:
            return f"#{self.attrs['confirms']} seed {self.seed}"
        if self.role == ROLE_FLOAT32_CLIP:
            return f"float32, clip {self.config.clip_norm:.3g}"
        if self.role in (ROLE_ISLAND, ROLE_REPLAY):
            return f"{self.role} #{self.number}"
        return f"trial #{self.number}"

    @property
    def reached(self) -> bool:
        return self.state == "complete" and self.steps_to_target is not None

    @property
    def steps_to_target(self) -> int | None:
        value = self.attrs.get("steps_to_target")
        return None if value is None else int(value)

    @property
    def time_to_target(self) -> float:
        value = self.attrs.get("time_to_target_s")
        return math.inf if value is None else float(value)

    @property
    def prune_kind(self) -> str | None:
        return self.attrs.get("pruned_because")

    @property
    def reused(self) -> bool:
        """A sampled config that had run already: its result was copied, nothing trained."""
        return "duplicate_of" in self.attrs

    @property
    def steps_run(self) -> int:
        return 0 if self.reused else int(self.attrs.get("steps_run") or 0)

    @property
    def stability(self) -> tuple[int, float]:
        """Lower is more stable: skipped steps, then how close the loss scale came to the
        collapse floor (runs without a scaler have all the headroom there is)."""
        skipped = int(self.attrs.get("skipped_steps") or 0)
        low = self.attrs.get("min_scale")
        if not self.config.uses_scaler or not low:
            return skipped, -math.inf
        return skipped, -math.log2(float(low) / _policy.SCALE_FLOOR)


def outcomes_of(trials: Iterable[FrozenTrial]) -> list[Outcome]:
    """Finished AMP runs (complete or pruned), in trial-number order; the float32 reference
    trials are the yardstick, not candidates, and are left out, and so are runs whose
    evidence is damaged (:func:`~scalertune._judge._stored.sound`)."""
    done = (TrialState.COMPLETE, TrialState.PRUNED)
    return [
        Outcome.from_trial(t)
        for t in sound(trials)[0]
        if t.state in done and t.user_attrs.get("role") in RUN_ROLES
    ]


def reference_trial(study: optuna.Study, seed: int) -> optuna.trial.FrozenTrial | None:
    """The finished float32 reference trial of ``seed``, if it has run (the first whose
    evidence is sound: one damaged is run again, :func:`damaged_references`)."""
    for trial in _reference_trials(study, seed):
        try:
            reference_data(trial, seed)
        except DamagedEvidence:
            continue
        return trial
    return None


def reference_of(study: optuna.Study, seed: int) -> dict[str, Any] | None:
    """The float32 reference of ``seed`` as plain data, or ``None`` if it has not run yet
    (or every reference of that seed the study holds is damaged).

    A reference to a horizon longer than a trial has its ``horizon`` (the steps it trained),
    its losses over each phase window by first step (``windows``: float32's own continuation
    there) and the checkpoint each window starts from (``checkpoints``); another has
    ``horizon`` ``None`` and neither. Its ``trace`` is the gradient trace, decoded
    (``None`` where it recorded none)."""
    for trial in _reference_trials(study, seed):
        try:
            return reference_data(trial, seed)
        except DamagedEvidence:
            continue
    return None


def damaged_references(study: optuna.Study, seed: int) -> dict[int, str]:
    """The finished float32 references of ``seed`` whose evidence is damaged: trial number
    -> why."""
    damaged = {}
    for trial in _reference_trials(study, seed):
        try:
            reference_data(trial, seed)
        except DamagedEvidence as exc:
            damaged[trial.number] = str(exc)
    return damaged


def _reference_trials(study: optuna.Study, seed: int) -> list[optuna.trial.FrozenTrial]:
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.user_attrs.get("role") == ROLE_REFERENCE and t.user_attrs.get("seed") == seed
    ]
