"""How the in-run check says what it did: one line per action, as an
:class:`~scalertune._amp._check.AmpCheckWarning` and through the ``scalertune`` logger; each
check's figures through the logger alone, at debug level."""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

from scalertune._amp._check import AmpCheckError, AmpCheckWarning
from scalertune._amp._watch import caller_stacklevel

#: The package's logger. A library adds no handler of its own but a NullHandler, so that a
#: program that configures no logging sees the warnings once, not a second copy from
#: Python's last-resort handler.
LOGGER = logging.getLogger("scalertune")
LOGGER.addHandler(logging.NullHandler())


@dataclasses.dataclass(frozen=True)
class Action:
    """What the check did at a step, and why: ``kind`` is ``island`` (a module kept in
    float32 for the precision), ``overflow`` (modules kept in float32 after a forward
    overflow, and the scale kept from collapsing), ``scale`` (a scale collapsed by gradients
    too large for float16, set back once they passed), ``recipe`` (a more accurate float8 recipe),
    ``bfloat16`` (out of float8), ``float32``, ``knobs`` or ``none`` (the policy warned)."""

    step: int
    kind: str
    line: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "kind": self.kind, "line": self.line}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Action:
        return cls(step=int(data["step"]), kind=str(data["kind"]), line=str(data["line"]))


def say(action: Action) -> None:
    """The action's line, as a warning pointed at the user's line, and in the log."""
    warn(action.line)


def warn(line: str) -> None:
    """``line`` as an :class:`AmpCheckWarning` pointed at the user's line, and in the log."""
    LOGGER.warning(line)
    warnings.warn(AmpCheckWarning(line), stacklevel=caller_stacklevel())


def stop(line: str) -> AmpCheckError:
    """The error a ``stop`` policy raises, logged first."""
    LOGGER.error(line)
    return AmpCheckError(line)


def heading(step: int) -> str:
    return f"scalertune check at step {step:,}"


def scale_text(scale: float) -> str:
    """``2**10`` for a power of two, else ``0.0123``."""
    import math

    if scale > 0 and math.isfinite(scale):
        power = math.log2(scale)
        if power == int(power):
            return f"2**{int(power)}"
    return f"{scale:.3g}"
