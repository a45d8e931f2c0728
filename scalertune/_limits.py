"""The valid range of the numbers a user passes to the Python API and the command line.

The Python API and the command line check those numbers with the same table, before any
work starts (the command line before torch has even loaded). A number out of range is a
:class:`~scalertune.UsageError` of class :class:`ParameterError` (a ``ValueError``) that names
the Python parameter; the command line says the same with the flag it reads the value from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from scalertune import _policy
from scalertune._errors import ParameterError
from scalertune._text import shown

#: The most ranks ``--nproc-per-node`` starts on one host: the most devices one node holds
#: (8 GPUs is the common node; 64 leaves room for CPU ranks), past which a number is a typo.
MAX_NPROC_PER_NODE = 64

#: ``--seed`` is used as is by ``random``, NumPy and torch; NumPy's legacy seeding accepts
#: 0 to 2**32 - 1, the narrowest of the three.
MAX_SEED = 2**32 - 1

#: The most training steps a run may take. A run keeps its per-step loss and loss scale in
#: device buffers and in the study, so an absurd --steps fails late, in the reference run;
#: a million steps is far past where a scaler's settings show (its growth interval defaults
#: to 2000 steps), yet a few MB per run.
MAX_STEPS = 1_000_000

#: The longest horizon a search may cover. The float32 reference trains that far once and
#: keeps its per-step loss and a compact gradient trace (a few bytes a step); ten million
#: steps is past any training run a search would be asked about, yet a bounded record.
MAX_HORIZON = 10_000_000

#: The loss scale lives in a float32 tensor: a larger number would be inf there.
FLOAT32_MAX = 3.4028234663852886e38
#: float32's smallest normal number: a loss scale below it rounds toward 0 in GradScaler's
#: float32 scale tensor.
FLOAT32_TINY = 2.0**-126


@dataclasses.dataclass(frozen=True)
class Limit:
    """What one number may be: an integer or a real, from ``low`` to ``high``."""

    integer: bool
    low: float
    high: float = math.inf
    low_excluded: bool = False

    def check(self, name: str, value: Any) -> None:
        """:class:`ParameterError` naming ``name`` unless ``value`` is within the limit."""
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            raise ParameterError(name, f"must be {self._wanted()}, got {shown(value)}")
        # NaN fails every comparison below, infinity the last one
        ok = value > self.low if self.low_excluded else value >= self.low
        if not (ok and (self.integer or math.isfinite(value))):
            raise ParameterError(name, f"must be {self._wanted()}, got {_got(value)}")
        if value > self.high:
            wanted = self._wanted() if self.integer else f"at most {self.high:g}"
            raise ParameterError(name, f"must be {wanted}, got {_got(value)}")

    def _wanted(self) -> str:
        if self.integer:
            return (
                f"an integer >= {self.low:.0f}"
                if self.high == math.inf
                else f"an integer from {self.low:.0f} to {self.high:.0f}"
            )
        if self.low_excluded and self.low == 0:
            return "a positive finite number"
        return f"a finite number {'>' if self.low_excluded else '>='} {self.low:g}"


def _got(value: Any) -> str:
    return shown(value) if isinstance(value, int) else f"{value:g}"


_COUNT = Limit(True, 0)
_SEED = Limit(True, 0, MAX_SEED)
_SECONDS = Limit(False, 0, low_excluded=True)

#: Python parameter -> its limit, per function (the command line reads the same names).
SEARCH: Mapping[str, Limit] = {
    "n_trials": _COUNT,
    # two read-back windows: a run's first window is its warm-up, whose time is not counted
    "steps": Limit(True, 2 * _policy.READBACK_INTERVAL, MAX_STEPS),
    "horizon": Limit(True, 2 * _policy.READBACK_INTERVAL, MAX_HORIZON),
    "seed": _SEED,
    "timeout": _SECONDS,
    "timeout_s": _SECONDS,
    "memory_gb": _SECONDS,
    "nproc_per_node": Limit(True, 1, MAX_NPROC_PER_NODE),
    "wait_for_storage": Limit(False, 0),
    "rendezvous_timeout": _SECONDS,
    "host_timeout": _SECONDS,
}
DIAGNOSE: Mapping[str, Limit] = {
    "init_scale": Limit(False, FLOAT32_TINY, FLOAT32_MAX),
    "steps": Limit(True, 1, MAX_STEPS),
    "seed": _SEED,
}
EXPORT: Mapping[str, Limit] = {"micro_batch_size": Limit(True, 1)}
REPORT: Mapping[str, Limit] = {"top": _COUNT, "trial": _COUNT}
DASHBOARD: Mapping[str, Limit] = {"port": Limit(True, 1, 65535)}


def horizon(steps: int, asked: int | None = None, declared: int | None = None) -> int:
    """The horizon a search's evidence covers: the one ``asked`` for, else the factory's
    ``declared`` one, else the trial's ``steps``; never shorter than a trial (it is the
    training the evidence covers, and the trial is part of it)."""
    found = asked or declared or steps
    check_horizon(steps, found)
    return found


def check_horizon(steps: int, horizon: int) -> None:
    """:class:`ParameterError` unless ``horizon`` is at least a trial's ``steps``."""
    if horizon < steps:
        raise ParameterError(
            "horizon",
            f"must be at least a trial's steps ({steps}): it is "
            f"the training the evidence covers; got {horizon}",
        )


def check(limits: Mapping[str, Limit], **values: Any) -> None:
    """Check each value (``None`` means "not given") against its limit, in the order given."""
    for name, value in values.items():
        if value is not None:
            limits[name].check(name, value)
