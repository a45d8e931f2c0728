"""The float32 reference as one typed record: written by the search when its reference run
finishes, read back by every worker and by everything that judges or reviews the study.

The reference is the yardstick of every run: the same workload, the same seed, no autocast.
Its loss curve over the trial's steps sets the target; over a horizon longer than a trial it
also holds float32's own losses over each phase window (what a branch there is compared
with) and the checkpoint each window starts from; the search's own seed also holds the
interleaved step timing of every dtype and the gradient trace that the scaler replay reads.

It is stored on its trial (role ``reference``), as its user and system attributes
(:meth:`Reference.to_attrs`, with its ``version``), and :meth:`Reference.from_trial` reads
every version a study may hold. These two are the only places that know the stored keys
(:meth:`StudyView.reference_of <scalertune._judge._view.StudyView.reference_of>` finds the trial).
What a study holds is data, never trusted: a part that is not what a reference stores (of
another type, out of bounds, a trace that does not decode) makes the record
:class:`~scalertune._errors.DamagedEvidence`, named in one line, and the reference is read
as missing (the search runs it again).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from optuna.trial import FrozenTrial

from scalertune import _limits
from scalertune._amp._config import ALL_DTYPES
from scalertune._errors import DamagedEvidence
from scalertune._judge._target import Target
from scalertune._replay._trace import Trace
from scalertune._run._step_times import StepTimes
from scalertune._storage._names import (
    HORIZON_ATTR,
    LOSSES_ATTR,
    REFERENCE_VERSION_ATTR,
    ROLE_REFERENCE,
    TIMES_ATTR,
    TRACE_ATTR,
)

#: The record's format, stored with it. 2: this record. 1: a reference stored before it had
#: a version (the same keys; the step timing, the trace and the horizon's parts missing in
#: the studies written before each).
VERSION = 2


@dataclasses.dataclass(frozen=True)
class Reference:
    """The float32 reference of one seed (see the module's docstring).

    Example:
        >>> from scalertune._judge._reference import Reference
        >>> ref = Reference(seed=0, losses=(2.0, 1.0, 0.5), target_loss=0.51,
        ...                 steps_to_target=3, step_time_s=0.002, steps_run=3)
        >>> ref.time_to_target_s
        0.006
    """

    seed: int
    #: Its per-step losses over the trial's steps: the target's curve.
    losses: tuple[float, ...]
    #: The loss float32 reaches by the end of a trial, with the target's tolerance.
    target_loss: float
    #: When float32 itself reached its target (``None`` if it never did).
    steps_to_target: int | None
    #: Its median step time: float32's in the interleaved timing, where it ran.
    step_time_s: float | None
    #: The steps it trained (to the horizon, over a long one).
    steps_run: int | None
    #: The interleaved step timing of every dtype the study may run (the search's own seed).
    step_times: StepTimes | None = None
    #: The steps it trained to, over a horizon longer than a trial; ``None`` otherwise.
    horizon: int | None = None
    #: float32's own losses over each phase window, by the window's first step.
    windows: Mapping[int, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    #: float32's checkpoint at each phase window's first step, by name.
    checkpoints: Mapping[int, str] = dataclasses.field(default_factory=dict)
    #: Its gradient trace (``None`` for a reference that recorded none).
    trace: Trace | None = dataclasses.field(default=None, compare=False, repr=False)
    #: Its trial's number (``-1`` before it is stored).
    trial: int = -1
    version: int = VERSION

    @property
    def target(self) -> Target:
        """The float32 target its losses set."""
        return Target.from_reference(self.losses)

    @property
    def time_to_target_s(self) -> float | None:
        """float32's time to its own target: its steps to target times its step time."""
        if self.steps_to_target is None or not self.step_time_s:
            return None
        return self.steps_to_target * self.step_time_s

    @property
    def latest_start(self) -> int:
        """Its last phase window's first step."""
        return max(self.windows)

    def repeated(self, time_to_target_s: float) -> dict[str, Any]:
        """What a trial that repeats this run (the recommended trial, where float32 is the
        answer) shows of it: its figures as its own trial shows them, but its role and seed
        (the repeat's own), and its time to target the repeat's own rounding."""
        user, _ = self.to_attrs()
        del user["role"], user["seed"]
        return {**user, "time_to_target_s": time_to_target_s}

    def to_attrs(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The record as its trial stores it: (user attributes, system attributes)."""
        user = {
            "role": ROLE_REFERENCE,
            "seed": self.seed,
            "target_loss": self.target_loss,
            "steps_to_target": self.steps_to_target,
            "step_time_s": self.step_time_s,
            "time_to_target_s": (
                None
                if self.steps_to_target is None or self.step_time_s is None
                else self.steps_to_target * self.step_time_s
            ),
            "steps_run": self.steps_run,
        }
        system: dict[str, Any] = {
            LOSSES_ATTR: list(self.losses),
            REFERENCE_VERSION_ATTR: self.version,
        }
        if self.step_times is not None:
            system[TIMES_ATTR] = self.step_times.to_dict()
        if self.trace is not None:
            system[TRACE_ATTR] = self.trace.encode()
        if self.horizon is not None:
            system[HORIZON_ATTR] = {
                "horizon": self.horizon,
                "windows": {str(k): list(v) for k, v in self.windows.items()},
                "checkpoints": {str(k): v for k, v in self.checkpoints.items()},
            }
        return user, system

    @classmethod
    def from_trial(cls, trial: FrozenTrial) -> Reference:
        """The record ``trial`` stores, in any version a study may hold; one that is not a
        reference's (see the module) is :class:`~scalertune._errors.DamagedEvidence`,
        named in one line."""
        user, system = trial.user_attrs, trial.system_attrs
        where = f"trial #{trial.number}"
        version = system.get(REFERENCE_VERSION_ATTR, 1)
        if not _is_integer(version) or not 0 < version <= VERSION:
            raise _damaged(where, "version", f"is not one this scalertune reads ({VERSION})")
        late = system.get(HORIZON_ATTR) or {}
        if not isinstance(late, Mapping):
            raise _damaged(where, HORIZON_ATTR, "is not a mapping")
        return cls(
            seed=_seed(user.get("seed", 0), where),
            losses=_curve(system.get(LOSSES_ATTR, []), where, LOSSES_ATTR),
            target_loss=_target_loss(user.get("target_loss"), where),
            steps_to_target=_optional(
                _integer, user.get("steps_to_target"), where, "steps_to_target"
            ),
            step_time_s=_optional(_seconds, user.get("step_time_s"), where, "step_time_s"),
            steps_run=_optional(_integer, user.get("steps_run"), where, "steps_run"),
            step_times=_step_times(system.get(TIMES_ATTR), where),
            horizon=_horizon(late, where),
            windows=_windows(late.get("windows") or {}, where),
            checkpoints=_checkpoints(late.get("checkpoints") or {}, where),
            trace=_trace(system.get(TRACE_ATTR), where),
            trial=trial.number,
            version=version,
        )


def same_on_every_seed(curves: Sequence[Sequence[float]]) -> bool:
    """Whether float32 trained the same on every seed (two at least): the same loss at every
    step. The factory then does not follow the seed scalertune sets (see
    :func:`unseeded_note`).

    Example:
        >>> same_on_every_seed([(2.0, 1.0), (2.0, 1.0)]), same_on_every_seed([(2.0,), (2.1,)])
        (True, False)
    """
    return len(curves) > 1 and all(tuple(c) == tuple(curves[0]) for c in curves[1:])


def unseeded_note(seeds: Sequence[int]) -> str:
    """What float32 trained the same on ``seeds`` means for the search, in one line."""
    return (
        f"float32 trained the same on seeds {', '.join(map(str, seeds))} (the same loss at "
        "every step): the factory does not follow the seed scalertune sets (a "
        "torch.manual_seed of its own, or weights and data order fixed), so the "
        "confirmation seeds confirm nothing more than one seed; leave the seeding to "
        "scalertune to have them"
    )


def _damaged(where: str, key: str, why: str) -> DamagedEvidence:
    return DamagedEvidence(f"{where}'s {key} is damaged: it {why}")


def _is_integer(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 2**62


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: Any, where: str, key: str) -> int:
    if not _is_integer(value) or not 0 <= value <= _limits.MAX_HORIZON:
        raise _damaged(where, key, "is not a count of steps")
    return int(value)


def _seed(value: Any, where: str) -> int:
    if not _is_integer(value):
        raise _damaged(where, "seed", "is not a whole number")
    return int(value)


def _seconds(value: Any, where: str, key: str) -> float:
    if not _is_number(value) or not 0 <= value < math.inf:
        raise _damaged(where, key, "is not a number of seconds")
    return float(value)


def _optional(read: Any, value: Any, where: str, key: str) -> Any:
    return None if value is None else read(value, where, key)


def _target_loss(value: Any, where: str) -> float:
    if not _is_number(value) or not math.isfinite(value):
        raise _damaged(where, "target_loss", "is not a finite number")
    return float(value)


def _curve(values: Any, where: str, key: str) -> tuple[float, ...]:
    """A loss per step, no longer than the longest horizon, finite (float32's reference that
    went non-finite is refused as it runs: a NaN or an infinity here was written by another
    hand, and the target's statistics would not survive it)."""
    if (
        not isinstance(values, (list, tuple))
        or len(values) > _limits.MAX_HORIZON
        or not all(_is_number(v) and math.isfinite(v) for v in values)
    ):
        raise _damaged(where, key, "is not a loss per step")
    return tuple(float(v) for v in values)


def _step_times(stored: Any, where: str) -> StepTimes | None:
    """The step timing: seconds per round of each dtype timed."""
    if not stored:
        return None
    rounds = stored.get("rounds") if isinstance(stored, Mapping) else None
    if (
        not isinstance(rounds, Mapping)
        or "float32" not in rounds
        or not all(
            dtype in ALL_DTYPES
            and isinstance(seconds, list)
            and 0 < len(seconds) <= _limits.MAX_HORIZON
            and all(_is_number(s) and 0 < s < math.inf for s in seconds)
            for dtype, seconds in rounds.items()
        )
        or not _is_integer(stored.get("steps", 0))
        or not (
            stored.get("load") is None
            or (_is_number(stored["load"]) and 0 <= stored["load"] < math.inf)
        )
    ):
        raise _damaged(where, TIMES_ATTR, "is not a step timing")
    return StepTimes.from_dict(dict(stored))


def _horizon(late: Mapping[str, Any], where: str) -> int | None:
    if not late:
        return None
    value = late.get("horizon")
    if not _is_integer(value) or not 0 < value <= _limits.MAX_HORIZON:
        raise _damaged(where, HORIZON_ATTR, "names no horizon")
    return value


def _step(key: Any, where: str) -> int:
    """A window's first step, as JSON keeps it: digits."""
    if not isinstance(key, str) or not key.isdigit() or len(key) > 12:
        raise _damaged(where, HORIZON_ATTR, "holds windows that are not by step")
    return int(key)


def _windows(windows: Any, where: str) -> dict[int, tuple[float, ...]]:
    if not isinstance(windows, Mapping):
        raise _damaged(where, HORIZON_ATTR, "holds windows that are not by step")
    return {_step(k, where): _curve(v, where, f"window at step {k}") for k, v in windows.items()}


def _checkpoints(names: Any, where: str) -> dict[int, str]:
    if not isinstance(names, Mapping) or not all(isinstance(v, str) for v in names.values()):
        raise _damaged(where, HORIZON_ATTR, "names checkpoints that are not text")
    return {_step(k, where): v for k, v in names.items()}


@functools.lru_cache(maxsize=4)  # a search judges the study again at every stage
def _decoded(text: str) -> Trace:
    return Trace.decode(text)


def _trace(text: Any, where: str) -> Trace | None:
    if text is None or text == "":
        return None
    try:
        return _decoded(text) if isinstance(text, str) else Trace.decode(text)
    except DamagedEvidence as exc:
        why = str(exc).partition(" is damaged: it ")[2] or str(exc)
        raise _damaged(where, "gradient trace", why) from None
