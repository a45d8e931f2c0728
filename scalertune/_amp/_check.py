"""The in-run check's policy, as a result file carries it, and what it says.

A search's evidence ends where its runs end: at its trials' ``steps``, or at its horizon.
The failures that come later (bfloat16's significant bits stopping the fit once float32
learns fine detail, an activation that grows past float16's range after thousands of steps,
a burst of large gradients that leaves the loss scale far too low) are caught by the run
itself: every ``every`` steps the runtime computes the loss of that step's batch again in
float32 at the run's current weights, forward only, and compares it with the step's own
mixed-precision loss (``scalertune._inrun`` does the work). What it does when the precision
fails is :attr:`CheckPolicy.action`:

- ``act`` (the default): keep the module that fails in float32 (a float32 island), or train
  in float32 when no island is enough; keep the loss scale from collapsing after a forward
  overflow; choose the scaler's knobs again from the run's own recent gradients when the
  scaler leaves the search's prediction. One :class:`AmpCheckWarning` line each.
- ``warn``: say the same line, and change nothing.
- ``stop``: raise :class:`AmpCheckError` with that line.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from scalertune import _policy
from scalertune._errors import UsageError
from scalertune._text import shown

#: What a failed check does (see the module's docstring).
ACTIONS = ("act", "warn", "stop")

#: The check's cadence: one float32 forward every this many steps. A forward is about a third
#: of a training step, so at 100 the check costs about 0.3% of training; the failures it is
#: for open over hundreds of steps (measured on a regression near 1000: bfloat16 1.02x
#: float32 at its weights at step 600, 1.16x at 900, 1.33x at 1200), so a check every 100
#: steps sees one within a few checks of the gap opening.
CHECK_EVERY = 100

#: How many recent checks the judgement reads: the gap must exceed the tolerance in their
#: mean and exceed their own noise (their standard error). 5 checks (500 steps at the default
#: cadence) give a standard error from 5 values; fewer make a single noisy batch an alarm.
CHECK_WINDOW = 5


#: The largest tolerance (100x float32's loss) and z a check takes: past them nothing is
#: ever judged failing, which is ``check=False`` said plainly.
_MOST = {"tolerance": 100.0, "z": 100.0}


class AmpCheckWarning(UserWarning):
    """What the in-run check found, and what it did (one line, with the step and the
    evidence); also logged through the ``scalertune`` logger."""


class AmpCheckError(RuntimeError):
    """The in-run check found the precision failing and its policy is ``stop``."""


@dataclasses.dataclass(frozen=True)
class CheckPolicy:
    """How often a run checks itself against float32, and what it does when that fails.

    A result file's ``check`` block; :func:`scalertune.load` and :func:`scalertune.attach`
    take one as ``check=`` to override it.

    Args:
        every: Steps between checks (100: one float32 forward, about a third of a step, every
            100 steps costs about 0.3% of training).
        action: What a failed check does: ``"act"`` (the default: a float32 island, float32,
            or the scaler's knobs chosen again), ``"warn"`` (say so, change nothing) or
            ``"stop"`` (raise :class:`AmpCheckError`).
        window: The recent checks a judgement reads (5; at least 2): the gap must exceed the
            tolerance in their mean and exceed their own noise.
        tolerance: How far the run's loss may lie above float32's at the same weights, as a
            share of it (0.25: 1.25x, the horizon's own rule, ``_policy.PHASE_TOLERANCE``),
            before the precision counts as failing.
        z: ... and by more than this many standard errors of the paired differences over
            the window (2.0, ``_policy.PHASE_Z``): one hard batch is no alarm.

    Raises:
        UsageError: An unknown ``action``, ``every`` outside 1 to 2**31 - 1, ``window``
            outside 2 to 1000, or a ``tolerance`` or ``z`` that is not a finite number above
            0.

    Example:
        >>> from scalertune import CheckPolicy
        >>> CheckPolicy(every=50, action="warn")
        CheckPolicy(every=50, action='warn', window=5, tolerance=0.25, z=2.0)
        >>> CheckPolicy(tolerance=0.1).to_dict()["tolerance"]
        0.1
    """

    every: int = CHECK_EVERY
    action: str = "act"
    window: int = CHECK_WINDOW
    tolerance: float = _policy.PHASE_TOLERANCE
    z: float = _policy.PHASE_Z

    def __post_init__(self) -> None:
        if not isinstance(self.action, str) or self.action not in ACTIONS:
            raise UsageError(
                f"the check's action must be one of {', '.join(ACTIONS)}, got {shown(self.action)}"
            )
        # at most: a step count torch's scaler could hold (int32), and a window of checks
        for name, low, high in (("every", 1, 2**31 - 1), ("window", 2, 1000)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise UsageError(
                    f"the check's {name} must be an integer from {low} to {high}, "
                    f"got {shown(value)}"
                )
        for name in ("tolerance", "z"):
            value = getattr(self, name)
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (number and math.isfinite(value) and 0 < value <= _MOST[name]):
                raise UsageError(
                    f"the check's {name} must be a number above 0 and at most {_MOST[name]:g}, "
                    f"got {shown(value)}"
                )
            object.__setattr__(self, name, float(value))

    def to_dict(self) -> dict[str, Any]:
        """What the result file's ``check`` block holds.

        Returns:
            ``every``, ``action`` and ``window``; ``tolerance`` and ``z`` where they are not
            the defaults (a file written before they were knobs reads the same).

        Example:
            >>> from scalertune import CheckPolicy
            >>> CheckPolicy().to_dict()
            {'every': 100, 'action': 'act', 'window': 5}
        """
        rule = {
            name: getattr(self, name)
            for name in ("tolerance", "z")
            if getattr(self, name) != getattr(_DEFAULT_POLICY_RULE, name)
        }
        return {"every": self.every, "action": self.action, "window": self.window, **rule}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckPolicy:
        """Read a ``check`` block, its unknown keys refused by name.

        Args:
            data: The block; missing keys take their defaults.

        Returns:
            The policy.

        Raises:
            UsageError: ``data`` is not a mapping, holds an unknown key or a bad value.

        Example:
            >>> from scalertune import CheckPolicy
            >>> CheckPolicy.from_dict({"every": 50, "action": "stop"}).action
            'stop'
        """
        if not isinstance(data, Mapping):
            raise UsageError(f"the check block must be a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise UsageError(
                f"unknown check key(s) {', '.join(map(str, unknown))}: use every, action, "
                "window, tolerance, z"
            )
        return cls(**data)


#: The rule's defaults, which a check block leaves out.
_DEFAULT_POLICY_RULE = CheckPolicy()


class RunCheck(Protocol):
    """What :class:`~scalertune.AmpRuntime` calls of its in-run check
    (``scalertune._inrun.InRunCheck``)."""

    policy: CheckPolicy

    @property
    def recording(self) -> bool:
        """Whether it records the run's gradients now (read on every step)."""
        ...

    def due(self, steps: int) -> bool: ...
    def run(
        self, amp: Any, closure: Callable[[], Any], recompute: Callable[[], Any], autocast: bool
    ) -> Any: ...
    def on_read(self, amp: Any, *, scale: float, bad_loss: bool) -> bool: ...
    def rescue(self, amp: Any) -> bool: ...
    def on_drift(self, amp: Any, found: str) -> None: ...
    def record(self, amp: Any, optimizer: Any) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
    def report(self, amp: Any) -> str: ...
