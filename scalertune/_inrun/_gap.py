"""The in-run check's judgement: is the run's precision failing now?

Each check pairs the step's mixed-precision loss with the same batch's float32 loss at the
same weights. The judgement is the horizon's rule (``_judge._phases``, one function:
:func:`falls_behind`), over the last ``window`` checks instead of a window's steps: the
mixed-precision losses' mean exceeds float32's by more than the policy's ``tolerance`` of it
(``PHASE_TOLERANCE`` by default), **and** by more than its ``z`` standard errors of the paired
differences (``PHASE_Z``), so that one hard batch is no alarm. Both losses are
taken at the same weights, so the difference is the precision's own: a run whose forward is
as good as float32's passes however its loss moves. After the check kept a module in
float32 because its island brought the step's batch within ``ISLAND_CLOSES`` of float32's
loss, the checks that follow hold it to that claim: beyond it (and the noise), the island
was not enough.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from scalertune import _policy


def relative(ours: float, float32: float) -> float:
    """A loss ``ours`` over float32's, as every rule reads it (the in-run check, its islands,
    the horizon's phases, the search's island choice): 1 plus the excess as a share of
    float32's size, so that a loss that may be negative (a Gaussian negative log-likelihood)
    reads above 1 when it is worse; ``ours / float32`` for a positive float32 loss. ``inf``
    where ``ours`` is not finite, or float32's is 0 and ``ours`` is not.

    >>> relative(3.0, 2.0), relative(-1.0, -2.0), relative(-3.0, -2.0)
    (1.5, 1.5, 0.5)
    """
    if not math.isfinite(ours):
        return math.inf
    if float32 == 0:
        return 1.0 if ours == 0 else math.inf
    return 1 + (ours - float32) / abs(float32)


@dataclasses.dataclass(frozen=True)
class Check:
    """One check: the step, the mixed-precision loss and float32's at the same weights."""

    step: int
    ours: float
    float32: float

    @property
    def ratio(self) -> float:
        return relative(self.ours, self.float32)

    def to_list(self) -> list[float]:
        return [self.step, self.ours, self.float32]


@dataclasses.dataclass(frozen=True)
class Gap:
    """The judgement over recent checks: their mean ratio and how many standard errors of
    the paired differences its excess is."""

    ratio: float
    z: float
    checks: int

    def beyond(self, tolerance: float, z: float = _policy.PHASE_Z) -> bool:
        """The ratio exceeds ``1 + tolerance`` and its excess exceeds ``z`` standard errors
        (:func:`falls_behind`)."""
        return falls_behind(self.ratio, self.z, tolerance, z)

    def describe(self) -> str:
        z = "inf" if math.isinf(self.z) else f"{self.z:.1f}"
        return (
            f"{self.ratio:.3g}x float32's over the last {self.checks} checks ({z} standard errors)"
        )


def falls_behind(
    ratio: float,
    z: float,
    tolerance: float = _policy.PHASE_TOLERANCE,
    bound: float = _policy.PHASE_Z,
) -> bool:
    """The comparison rule, one function for the in-run check (:meth:`Gap.beyond`, with the
    run's :class:`~scalertune._amp._check.CheckPolicy`) and the horizon's phases
    (:attr:`PhaseResult.behind <scalertune._judge._phases.PhaseResult.behind>`): a loss
    ``ratio`` over float32's at the same weights is behind when it exceeds ``1 + tolerance``
    **and** its excess is more than ``bound`` standard errors (``z``) of its noise."""
    return ratio - 1 > tolerance and z > bound


def judge(checks: Sequence[Check]) -> Gap | None:
    """The gap over ``checks`` (finite ones; ``None`` with fewer than two, or where float32's
    mean loss is 0: no ratio)."""
    pairs = [c for c in checks if math.isfinite(c.ours) and math.isfinite(c.float32)]
    if len(pairs) < 2:
        return None
    n = len(pairs)
    reference = math.fsum(c.float32 for c in pairs) / n
    if reference == 0:
        return None
    diffs = [c.ours - c.float32 for c in pairs]
    excess = math.fsum(diffs) / n
    # the excess over float32's loss, as a share of its size (a loss may be negative)
    return Gap(ratio=relative(reference + excess, reference), z=z_score(diffs, excess), checks=n)


def z_score(samples: Sequence[float], mean: float) -> float:
    """How many standard errors of ``samples`` (their sample standard deviation over the
    square root of their count) ``mean`` is: the rule's noise, one function for the in-run
    check (its checks' paired differences) and the horizon's phases (the means of blocks of
    a window's paired differences, ``_judge._phases``). ``inf`` for a positive mean without
    noise, 0 with fewer than two samples. In floats: ``statistics.stdev``'s exact fractions
    cost a millisecond a check, and fail on a NaN where this gives NaN."""
    n = len(samples)
    if n < 2:
        return 0.0
    centre = math.fsum(samples) / n
    error = math.sqrt(math.fsum((s - centre) ** 2 for s in samples) / (n - 1) / n)
    if error > 0:
        return mean / error
    return math.inf if mean > 0 else 0.0
