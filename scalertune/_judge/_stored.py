"""What a study holds, checked before anything is judged from it.

A study is written by every worker of a search, and by whoever else can write its storage (a
shared database, a journal file in a shared folder). What scalertune reads back from it is
data, never trusted: a run's attributes must have the types and bounds a run stores
(:func:`checked_trial`), and a float32 reference every part a reference has, its gradient
trace decoded within its bounds (:meth:`Reference.from_trial
<scalertune._judge._reference.Reference.from_trial>`). A trial that fails the check is
damaged evidence (:class:`~scalertune._errors.DamagedEvidence`): named in one line, left
out of every judgement (:meth:`StudyView.sound <scalertune._judge._view.StudyView.sound>`),
and run again where the search runs it (a float32 reference of that seed runs again; a
once-per-study run is queued again as one the study lacks). Nothing in a value is run, and
no value is trusted to be small: a curve, a scale run or a trace longer than the longest
horizon is damaged too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from scalertune import _limits
from scalertune._errors import DamagedEvidence
from scalertune._judge._judged import Judged
from scalertune._judge._reference import Reference
from scalertune._storage._names import LOSSES_ATTR, ROLE_REFERENCE, SCALES_ATTR, TRACEBACK_ATTR
from scalertune._storage._trial_record import (
    Job,
    Marks,
    Recommendation,
    damaged,
    is_integer,
    is_number,
)


@dataclasses.dataclass(frozen=True)
class Records:
    """A trial's records, read and checked: what it runs, what the search noted, what was
    judged of it."""

    job: Job
    marks: Marks
    judged: Judged


def checked_trial(trial: FrozenTrial) -> tuple[Records, Reference | None]:
    """The trial's records, read in its check, and for a finished float32 reference its
    record, read there too: :class:`DamagedEvidence` names the first attribute of ``trial``
    that is not what a run stores, or a finished float32 reference holds (see the module)."""
    records = _check_run(trial)
    if records.job.role == ROLE_REFERENCE and trial.state == TrialState.COMPLETE:
        return records, Reference.from_trial(trial)
    return records, None


def read_records(trial: FrozenTrial) -> Records:
    """``trial``'s records, checked (:func:`checked_trial`), where no view keeps them."""
    return checked_trial(trial)[0]


def _check_run(trial: FrozenTrial) -> Records:
    """Each of the trial's records read (:class:`~scalertune._storage._trial_record.Job`,
    :class:`~scalertune._storage._trial_record.Marks`, :class:`~scalertune._judge._judged.Judged`:
    their readers check every value), its traceback, loss curve and scale runs."""
    records = Records(Job.of_trial(trial), Marks.of_trial(trial), Judged.of_trial(trial))
    Recommendation.of_trial(trial)
    where = f"trial #{trial.number}"
    system = trial.system_attrs
    if system.get(TRACEBACK_ATTR) is not None and not isinstance(system[TRACEBACK_ATTR], str):
        raise damaged(where, "traceback", "is not text")
    curve(system.get(LOSSES_ATTR, []), f"{where}'s {LOSSES_ATTR}")
    scales = system.get(SCALES_ATTR, [])
    if not isinstance(scales, list) or not all(_is_scale_run(run) for run in scales):
        raise damaged(where, SCALES_ATTR, "is not runs of [scale, steps]")
    if sum(run[1] for run in scales) > _limits.MAX_HORIZON:
        raise damaged(where, SCALES_ATTR, "runs past the longest horizon")
    return records


def curve(values: Any, what: str) -> list[float]:
    """``values`` as a loss curve: a list of numbers no longer than the longest horizon;
    :class:`DamagedEvidence` naming ``what`` otherwise."""
    if (
        not isinstance(values, list)
        or len(values) > _limits.MAX_HORIZON
        or not all(is_number(v) for v in values)
    ):
        raise DamagedEvidence(f"{what} is damaged: it is not a loss per step")
    return [float(v) for v in values]


def _is_scale_run(run: Any) -> bool:
    return (
        isinstance(run, list)
        and len(run) == 2
        and is_number(run[0])
        and is_integer(run[1])
        and run[1] >= 0
    )
