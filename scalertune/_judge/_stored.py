"""What a study holds, checked before anything is judged from it.

A study is written by every worker of a search, and by whoever else can write its storage (a
shared database, a journal file in a shared folder). What scalertune reads back from it is
data, never trusted: a run's attributes must have the types and bounds a run stores
(:func:`check_trial`), and a float32 reference every part a reference has, its gradient
trace decoded within its bounds (:meth:`Reference.from_trial
<scalertune._judge._reference.Reference.from_trial>`). A trial that fails the check is
damaged evidence (:class:`~scalertune._errors.DamagedEvidence`): named in one line, left
out of every judgement (:func:`sound`), and run again where the search runs it (a float32
reference of that seed runs again; a once-per-study run is queued again as one the study
lacks). Nothing in a value is run, and no value is trusted to be small: a curve, a scale
run or a trace longer than the longest horizon is damaged too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

from optuna.trial import FrozenTrial, TrialState

from scalertune import _limits
from scalertune._amp._config import AmpConfig
from scalertune._errors import DamagedEvidence, UsageError
from scalertune._judge._reference import Reference
from scalertune._storage._names import (
    JUDGED_ATTR,
    LOSSES_ATTR,
    ROLE_REFERENCE,
    SCALES_ATTR,
    TRACEBACK_ATTR,
)
from scalertune._storage._store import plain

#: Attributes a run stores as whole numbers (or ``None``), and as numbers of any kind.
_INTEGERS = (
    "seed",
    "skipped_steps",
    "first_nonfinite_step",
    "steps_run",
    "steps_to_target",
    "loss_vs_float32_step",
    "start",
    "end",
    "of",
    "confirms",
    "duplicate_of",
    "island_of",
    "clip_of",
    "phase_start",
    "phase_end",
    "phase_forward_at",
)
_NUMBERS = (
    "final_scale",
    "min_scale",
    "initial_scale",
    "step_time_s",
    "time_to_target_s",
    "measured_step_time_s",
    "loss_vs_float32",
    "target_loss",
    "phase_ratio",
    "phase_z",
    "phase_forward",
)
#: ... and as text: what a run is and how it ended.
_TEXTS = ("role", "baseline", "pruned_because", "prune_reason", "error", "missing", "traceback")


def check_trial(trial: FrozenTrial) -> Reference | None:
    """:class:`DamagedEvidence` naming the first attribute of ``trial`` that is not what a
    run stores, or a finished float32 reference holds (see the module); the reference's
    record, read in the check, for a finished float32 reference."""
    _check_run(trial)
    if trial.user_attrs.get("role") == ROLE_REFERENCE and trial.state == TrialState.COMPLETE:
        return Reference.from_trial(trial)
    return None


def _check_run(trial: FrozenTrial) -> None:
    attrs = _attrs(trial)
    where = f"trial #{trial.number}"
    for key in _INTEGERS:
        if attrs.get(key) is not None and not _is_integer(attrs[key]):
            raise _damaged(where, key, "is not a whole number")
    for key in _NUMBERS:
        if attrs.get(key) is not None and not _is_number(attrs[key]):
            raise _damaged(where, key, "is not a number")
    for key in _TEXTS:
        if attrs.get(key) is not None and not isinstance(attrs[key], str):
            raise _damaged(where, key, "is not text")
    for key in ("save", "continues"):
        if attrs.get(key) is not None and not plain(attrs[key]):
            raise _damaged(where, key, "is not a checkpoint's file name")
    if "config" in attrs:
        try:
            AmpConfig.from_dict(attrs["config"])
        except (UsageError, TypeError, ValueError) as exc:
            raise _damaged(where, "config", f"is not an AMP config ({exc})") from None
    system = trial.system_attrs
    curve(system.get(LOSSES_ATTR, []), f"{where}'s {LOSSES_ATTR}")
    scales = system.get(SCALES_ATTR, [])
    if not isinstance(scales, list) or not all(_is_scale_run(run) for run in scales):
        raise _damaged(where, SCALES_ATTR, "is not runs of [scale, steps]")
    if sum(run[1] for run in scales) > _limits.MAX_HORIZON:
        raise _damaged(where, SCALES_ATTR, "runs past the longest horizon")
    _check_phase_results(attrs.get("phase_results"), where)


def sound(trials: Iterable[FrozenTrial]) -> tuple[list[FrozenTrial], dict[int, str]]:
    """The trials whose attributes pass :func:`check_trial`, and the number of each other
    one -> why it is damaged."""
    good, damaged = [], {}
    for trial in trials:
        try:
            check_trial(trial)
        except DamagedEvidence as exc:
            damaged[trial.number] = str(exc)
        else:
            good.append(trial)
    return good, damaged


def curve(values: Any, what: str) -> list[float]:
    """``values`` as a loss curve: a list of numbers no longer than the longest horizon;
    :class:`DamagedEvidence` naming ``what`` otherwise."""
    if (
        not isinstance(values, list)
        or len(values) > _limits.MAX_HORIZON
        or not all(_is_number(v) for v in values)
    ):
        raise DamagedEvidence(f"{what} is damaged: it is not a loss per step")
    return [float(v) for v in values]


def _attrs(trial: FrozenTrial) -> dict[str, Any]:
    """The user attributes, the judged ones over them, and the traceback (as
    :meth:`Outcome.from_trial <scalertune._judge._outcome.Outcome.from_trial>` reads them)."""
    judged = trial.system_attrs.get(JUDGED_ATTR, {})
    if not isinstance(judged, Mapping):
        raise _damaged(f"trial #{trial.number}", JUDGED_ATTR, "is not a mapping")
    traceback = trial.system_attrs.get(TRACEBACK_ATTR)
    return {**trial.user_attrs, **judged, **({"traceback": traceback} if traceback else {})}


def _damaged(where: str, key: str, why: str) -> DamagedEvidence:
    return DamagedEvidence(f"{where}'s {key} is damaged: it {why}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_integer(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 2**62


def _is_scale_run(run: Any) -> bool:
    return (
        isinstance(run, list)
        and len(run) == 2
        and _is_number(run[0])
        and _is_integer(run[1])
        and run[1] >= 0
    )


def _check_phase_results(results: Any, where: str) -> None:
    """A run from step 0's windows (``phase_results``): a list of mappings of its figures."""
    if results is None:
        return
    if not isinstance(results, list) or len(results) > _limits.MAX_HORIZON:
        raise _damaged(where, "phase_results", "is not a list of windows")
    for window in results:
        if (
            not isinstance(window, Mapping)
            or not all(_is_integer(window.get(k)) for k in ("start", "end"))
            or not all(window.get(k) is None or _is_number(window[k]) for k in ("ratio", "z"))
            or not isinstance(window.get("nonfinite"), bool)
            or not (window.get("at") is None or _is_integer(window["at"]))
        ):
            raise _damaged(where, "phase_results", "holds a window that is not one")
