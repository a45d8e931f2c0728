"""A run's judged figures, as one typed record: one writer (:func:`store`) and one reader
(:meth:`Judged.read`).

A finished run's figures are stored twice: in full precision as one system attribute
(``_names.JUDGED_ATTR``), which the judging and ``report`` read, and rounded for reading as
user attributes, which the dashboard shows. The stored keys are the fields' names
(a phase run's verdict with ``phase_`` before each), each value's kind read from its
annotation and checked on reading (:mod:`scalertune._storage._trial_record`): a key is named once,
in its field. :data:`VERSION` is the record's format; one written by a later release is
damaged evidence here, not misread.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from optuna.trial import FrozenTrial

from scalertune import _limits
from scalertune._judge._phases import PhaseResult
from scalertune._storage._names import JUDGED_ATTR
from scalertune._storage._optuna import set_system_attr
from scalertune._storage._trial_record import checked, damaged, is_integer, is_number
from scalertune._text import readable

#: The judged record's format (absent in studies written before it was versioned: 1).
VERSION = 1
_VERSION_KEY = "version"


@dataclasses.dataclass(frozen=True)
class Figures:
    """A run's judged figures, as the study stores them (in full precision: the dashboard
    shows rounded copies), in the order the result's evidence lists them; ``None`` where a
    run has none (a pruned run never reached the target, a failed one has no step time)."""

    #: The step at which its smoothed loss reached the float32 target.
    steps_to_target: int | None = None
    #: Steps to target times its median step time.
    time_to_target_s: float | None = None
    step_time_s: float | None = None
    #: Steps GradScaler skipped (non-finite gradients).
    skipped_steps: int | None = None
    #: The loss scale's lowest and last values (runs with a scaler).
    min_scale: float | None = None
    final_scale: float | None = None
    first_nonfinite_step: int | None = None
    #: The steps it trained (a reused duplicate's: the original's).
    steps_run: int | None = None
    #: Its smoothed loss over float32's at the step it stopped, and that step.
    loss_vs_float32: float | None = None
    loss_vs_float32_step: int | None = None


#: Figures measured against the short trial's float32 target: a phase run has none.
SHORT_TRIAL_ONLY = (
    "steps_to_target",
    "time_to_target_s",
    "loss_vs_float32",
    "loss_vs_float32_step",
)


@dataclasses.dataclass(frozen=True)
class PhaseFigures:
    """A phase run's verdict (stored as ``phase_start``, ``phase_end``, ...): a branch's over
    its window, or a run from step 0's over the last window it reached, with each window's
    (:attr:`results`)."""

    start: int | None = None
    end: int | None = None
    #: Its mean loss over float32's, and the excess in standard errors (``None``: not finite).
    ratio: float | None = None
    z: float | None = None
    nonfinite: bool | None = None
    holds: bool | None = None
    #: Its forward's loss over float32's at float32's weights at step ``forward_at``, where
    #: it fell behind.
    forward: float | None = None
    forward_at: int | None = None
    #: A run from step 0's windows (``None`` for a branch).
    results: tuple[PhaseResult, ...] | None = None

    def result(self, start: int, end: int) -> PhaseResult:
        """A branch's verdict over its window ``start``-``end`` (its job's) as a
        :class:`PhaseResult` (no figure: inf)."""
        return PhaseResult(
            start=start,
            end=end,
            ratio=_inf(self.ratio),
            z=_inf(self.z),
            nonfinite=bool(self.nonfinite),
        )


@dataclasses.dataclass(frozen=True)
class Judged:
    """Everything judged of one run (the writer :func:`store`, the reader :meth:`read`)."""

    figures: Figures = Figures()
    #: Its median step time as measured in its own run (the figures' ``step_time_s`` is the
    #: search's timing of its dtype).
    measured_step_time_s: float | None = None
    #: The scale a phase run started from (the replay's, at its window's start).
    initial_scale: float | None = None
    #: Why it was pruned, in a word (``forward``, ``scale``, ``slower``...), and in words.
    pruned_because: str | None = None
    prune_reason: str | None = None
    phase: PhaseFigures | None = None

    def attrs(self) -> dict[str, Any]:
        """The record as stored, plain data: every figure (a phase run's but those of the
        short trial), the prune and the phase's verdict where there are."""
        figures = dataclasses.asdict(self.figures)
        if self.phase is not None:
            figures = {k: v for k, v in figures.items() if k not in SHORT_TRIAL_ONLY}
        out: dict[str, Any] = {
            _VERSION_KEY: VERSION,
            **figures,
            "measured_step_time_s": self.measured_step_time_s,
        }
        for key in ("initial_scale", "pruned_because", "prune_reason"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.phase is not None:
            out.update(_phase_attrs(self.phase))
        return out

    @classmethod
    def read(cls, stored: Mapping[str, Any], where: str = "a trial") -> Judged:
        """The record ``stored`` holds (a run's judged attribute), every value's kind
        checked: :class:`~scalertune._errors.DamagedEvidence` names the first that is not
        what the search writes."""
        version = stored.get(_VERSION_KEY, 1)
        if not is_integer(version) or not 0 < version <= VERSION:
            raise damaged(where, JUDGED_ATTR, "is of a format this release does not read")
        return cls(
            figures=Figures(**checked(Figures, stored, where)),
            phase=_read_phase(stored, where) if _PHASE_KEYS & stored.keys() else None,
            **checked(cls, stored, where),
        )

    @classmethod
    def of_trial(cls, trial: FrozenTrial) -> Judged:
        """``trial``'s judged record: the rounded user attributes under the full-precision
        system attribute, as every release wrote them."""
        judged = trial.system_attrs.get(JUDGED_ATTR, {})
        where = f"trial #{trial.number}"
        if not isinstance(judged, Mapping):
            raise damaged(where, JUDGED_ATTR, "is not a mapping")
        user = {k: v for k, v in trial.user_attrs.items() if k in _STORED}
        return cls.read({**user, **judged}, where)


def store(trial: Any, judged: Judged) -> None:
    """Store a run's judged record on the running ``trial``: in full precision as one system
    attribute, which the analysis and ``report`` read, and as user attributes rounded for
    reading, which the dashboard shows (the prune reason, a sentence, stays in the first
    and in the trial's note: drawn unwrapped among the attributes, it widened every trial
    page)."""
    set_system_attr(trial, JUDGED_ATTR, judged.attrs())
    for key, value in shown(judged).items():
        trial.set_user_attr(key, value)


def shown(judged: Judged) -> dict[str, Any]:
    """The user attributes the dashboard shows of ``judged``: its figures rounded for
    reading, without the prune reason and the format's version."""
    return {
        key: readable(value)
        for key, value in judged.attrs().items()
        if key not in ("prune_reason", _VERSION_KEY)
    }


def repeated(judged: Judged, time_to_target_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a trial that repeats a run judged ``judged`` (the recommended trial) stores of
    it: the user attributes of its figures, its time to target the repeat's own rounding
    (``time_to_target_s``), and the system attribute of the full record."""
    user = {**shown(judged), "time_to_target_s": time_to_target_s}
    return user, {JUDGED_ATTR: judged.attrs()}


def _phase_attrs(phase: PhaseFigures) -> dict[str, Any]:
    out = {f"phase_{k}": v for k, v in _fields(phase).items() if k != "results"}
    if phase.results is not None:
        out["phase_results"] = [_window(p) for p in phase.results]
    return out


def _window(p: PhaseResult) -> dict[str, Any]:
    return {
        "start": p.start,
        "end": p.end,
        "ratio": _finite(p.ratio),
        "z": _finite(p.z),
        "nonfinite": p.nonfinite,
        "at": p.at,
    }


def _read_phase(stored: Mapping[str, Any], where: str) -> PhaseFigures:
    values = checked(PhaseFigures, stored, where, prefix="phase_")
    results = stored.get("phase_results")
    if results is not None:
        values["results"] = _read_windows(results, where)
    return PhaseFigures(**values)


def _read_windows(results: Any, where: str) -> tuple[PhaseResult, ...]:
    """A run from step 0's windows (``phase_results``): a list of mappings of its figures."""
    if not isinstance(results, list) or len(results) > _limits.MAX_HORIZON:
        raise damaged(where, "phase_results", "is not a list of windows")
    out = []
    for window in results:
        if (
            not isinstance(window, Mapping)
            or not all(is_integer(window.get(k)) for k in ("start", "end"))
            or not all(window.get(k) is None or is_number(window[k]) for k in ("ratio", "z"))
            or not isinstance(window.get("nonfinite"), bool)
            or not (window.get("at") is None or is_integer(window["at"]))
        ):
            raise damaged(where, "phase_results", "holds a window that is not one")
        out.append(
            PhaseResult(
                start=int(window["start"]),
                end=int(window["end"]),
                ratio=_inf(window["ratio"]),
                z=_inf(window["z"]),
                nonfinite=bool(window["nonfinite"]),
                from_start=True,
                at=window.get("at"),
            )
        )
    return tuple(out)


def _fields(record: Any) -> dict[str, Any]:
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _inf(value: float | None) -> float:
    return math.inf if value is None else float(value)


#: The keys of a phase run's verdict: any of them stored makes the run's record one.
_PHASE_KEYS = frozenset(f"phase_{f.name}" for f in dataclasses.fields(PhaseFigures))
#: Every key the record stores, by its fields' names.
_STORED = frozenset(
    [f.name for f in dataclasses.fields(Figures)]
    + [f.name for f in dataclasses.fields(Judged) if f.name not in ("figures", "phase")]
    + [f"phase_{f.name}" for f in dataclasses.fields(PhaseFigures)]
)
