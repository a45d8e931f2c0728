"""Runs as the study stores them: each finished trial as an Outcome.

The study's float32 references are found, and its trials read once each, by
:class:`~scalertune._judge._view.StudyView`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from optuna.trial import FrozenTrial, TrialState

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._errors import DamagedEvidence
from scalertune._judge._judged import Figures
from scalertune._judge._stored import Records, checked_trial
from scalertune._storage._names import (
    LOSSES_ATTR,
    ROLE_BASELINE,
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_ISLAND,
    ROLE_REPLAY,
    ROLE_SEARCH,
    RUN_ROLES,
    SCALES_ATTR,
)
from scalertune._storage._trial_record import role_of

__all__ = ["Figures", "Outcome", "is_run", "outcomes_of", "read_outcome"]


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
    """One finished run as the study stores it: what it ran, how it ended, its figures.

    Its judged figures are :attr:`figures` (:class:`Figures`); :func:`read_outcome` is the
    one place that reads a run's stored attributes (:meth:`from_trial` checks them first).

    A :class:`SearchResult` holds them (its ``ranking``, ``baselines``, ``recommended``,
    ``best_amp``); they are read from the study, not built by hand.

    Example:
        >>> result = scalertune.analyze(study)  # doctest: +SKIP
        >>> best = result.ranking[0]  # doctest: +SKIP
        >>> best.label, best.config.describe(), best.steps_to_target  # doctest: +SKIP
        ('#7', 'float16 scale=4096 growth=2 backoff=0.5 every 2000, no clip', 186)
        >>> best.figures.skipped_steps  # doctest: +SKIP
        0
    """

    number: int
    role: str
    config: AmpConfig
    seed: int
    state: str
    losses: tuple[float, ...]
    scales: tuple[float, ...] = ()
    figures: Figures = Figures()
    #: The baseline it is (``pytorch-default``, ...), for a baseline.
    baseline: str | None = None
    #: The candidate's number it confirms on another seed, for a confirmation run.
    confirms: int | None = None
    #: The run whose result it reuses, for a sampled config that had run already.
    duplicate_of: int | None = None
    #: Why it was pruned, in a word (``forward``, ``scale``, ``slower``...), and in words.
    prune_kind: str | None = None
    prune_reason: str | None = None
    #: The error a failed run raised.
    error: str | None = None
    #: Where a forward overflow was (the culprit module) and the float32 islands checked to
    #: make the forward finite, comma-separated.
    overflow_module: str | None = None
    overflow_islands: str | None = None

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
                :func:`~scalertune._judge._stored.checked_trial`): named in one line.

        Example:
            >>> outcomes = [Outcome.from_trial(t) for t in study.trials]  # doctest: +SKIP
        """
        return read_outcome(trial, checked_trial(trial)[0])

    @property
    def label(self) -> str:
        if self.role == ROLE_BASELINE:
            return str(self.baseline)
        if self.role == ROLE_CONFIRM:
            return f"#{self.confirms} seed {self.seed}"
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
        value = self.figures.steps_to_target
        return None if value is None else int(value)

    @property
    def time_to_target(self) -> float:
        value = self.figures.time_to_target_s
        return math.inf if value is None else float(value)

    @property
    def reused(self) -> bool:
        """A sampled config that had run already: its result was copied, nothing trained."""
        return self.duplicate_of is not None

    @property
    def steps_run(self) -> int:
        """The steps it trained itself (none for a reused duplicate)."""
        return 0 if self.reused else int(self.figures.steps_run or 0)

    @property
    def stability(self) -> tuple[int, float]:
        """Lower is more stable: skipped steps, then how close the loss scale came to the
        collapse floor (runs without a scaler have all the headroom there is)."""
        skipped = int(self.figures.skipped_steps or 0)
        low = self.figures.min_scale
        if not self.config.uses_scaler or not low:
            return skipped, -math.inf
        return skipped, -math.log2(float(low) / _policy.SCALE_FLOOR)


def read_outcome(trial: FrozenTrial, records: Records) -> Outcome:
    """``trial`` as an :class:`Outcome`, from ``records``, the records its check read
    (:func:`~scalertune._judge._stored.checked_trial`: :meth:`Outcome.from_trial` checks it
    first), its curves decoded."""
    job, marks, judged = records.job, records.marks, records.judged
    if job.config is None:
        raise DamagedEvidence(f"trial #{trial.number} names no AMP config")
    return Outcome(
        number=trial.number,
        role=job.role or ROLE_SEARCH,
        config=job.config,
        seed=job.seed or 0,
        state=trial.state.name.lower(),
        losses=tuple(trial.system_attrs.get(LOSSES_ATTR, ())),
        scales=decode_scales(trial.system_attrs.get(SCALES_ATTR, [])),
        figures=judged.figures,
        baseline=job.baseline,
        confirms=job.confirms,
        duplicate_of=marks.duplicate_of,
        prune_kind=judged.pruned_because,
        prune_reason=judged.prune_reason,
        error=marks.error,
        overflow_module=marks.overflow_module,
        overflow_islands=marks.overflow_islands,
    )


def is_run(trial: FrozenTrial) -> bool:
    """Whether ``trial`` is a finished AMP run (complete or pruned): the float32 reference
    trials are the yardstick, not candidates."""
    return trial.state in (TrialState.COMPLETE, TrialState.PRUNED) and role_of(trial) in RUN_ROLES


def outcomes_of(trials: Iterable[FrozenTrial]) -> list[Outcome]:
    """Finished AMP runs (:func:`is_run`), in trial-number order, but runs whose evidence is
    damaged (:func:`~scalertune._judge._stored.checked_trial`), each checked and read once."""
    out = []
    for trial in trials:
        if not is_run(trial):
            continue
        try:
            records = checked_trial(trial)[0]
        except DamagedEvidence:
            continue
        out.append(read_outcome(trial, records))
    return out
