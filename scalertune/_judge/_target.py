"""Judging a run against the float32 reference: did it reach the target, and how fast?

The **float32 reference** is the same workload, same seed, without autocast. Its smoothed loss
at the last step, plus a small tolerance (``TARGET_TOLERANCE`` of it), is the **target**. A run
*reaches the target* at the first step where its own smoothed loss is at or below it; its
**time to target** is that step count times its dtype's step time, measured interleaved with
float32's (:mod:`scalertune._run._timing`). A run whose loss stays flat (gradients flushed to zero
by too small a scale) or that skips too many steps never reaches it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from scalertune import _policy
from scalertune._errors import UsageError
from scalertune._judge import _policy as _judge_policy


def smoothed(losses: Sequence[float]) -> list[float]:
    """Trailing mean over ``SMOOTHING_STEPS`` (fewer at the start); NaN where any is non-finite."""
    out, window = [], _policy.SMOOTHING_STEPS
    for i in range(len(losses)):
        chunk = losses[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk) if all(map(math.isfinite, chunk)) else math.nan)
    return out


@dataclasses.dataclass(frozen=True)
class Target:
    """The loss a run must reach to count as training as well as float32.

    float32's smoothed loss at its last step, plus ``TARGET_TOLERANCE`` (10%) of it. A
    search builds it from the float32 reference (:meth:`from_reference`); every run is judged
    against it.

    Example:
        >>> from scalertune import Target
        >>> target = Target.from_reference([4.0] * 10 + [1.0] * 10)
        >>> target.loss, target.reference_learned
        (1.1, True)
        >>> target.steps_to_target([4.0] * 5 + [0.5] * 20)
        14
    """

    loss: float
    reference_final: float
    reference_start: float
    #: float32's smoothed curve, step by step: what "loss vs float32 at step N" divides by.
    reference_curve: tuple[float, ...] = ()
    #: Standard error of float32's final smoothed loss: the standard deviation of its
    #: per-step losses over the last smoothing window, over the square root of its length.
    reference_noise: float = 0.0

    @classmethod
    def from_reference(cls, losses: Sequence[float]) -> Target:
        """The target of a float32 reference's per-step losses.

        Args:
            losses: float32's loss at each step.

        Returns:
            The target, with float32's smoothed curve (a trailing mean over ``SMOOTHING_STEPS``,
            10) and the standard error of its final smoothed loss.

        Raises:
            IndexError: ``losses`` is empty.

        Example:
            >>> from scalertune import Target
            >>> Target.from_reference([4.0] * 10 + [1.0] * 10).reference_final
            1.0
        """
        curve = smoothed(losses)
        start = curve[min(len(curve), _policy.SMOOTHING_STEPS) - 1]
        final = curve[-1]
        tail = list(losses[-_policy.SMOOTHING_STEPS :])
        noise = statistics.pstdev(tail) / math.sqrt(len(tail)) if len(tail) > 1 else 0.0
        return cls(
            loss=final + _policy.TARGET_TOLERANCE * abs(final),
            reference_final=final,
            reference_start=start,
            reference_curve=tuple(curve),
            reference_noise=noise,
        )

    @property
    def reference_learned(self) -> bool:
        """Whether float32 lowered its loss by a meaningful margin: at least
        ``REFERENCE_MIN_DROP`` of where it started, by more than
        ``REFERENCE_NOISE_MULTIPLE`` standard errors of its final smoothed loss, and to
        below where it started by more than the target's tolerance (the target lies below
        float32's start). Without that, every run "reaches" the target at once (a run that
        skipped every step included) and the search says nothing."""
        drop = self.reference_start - self.reference_final
        return (
            drop > _judge_policy.REFERENCE_MIN_DROP * abs(self.reference_start)
            and drop > _judge_policy.REFERENCE_NOISE_MULTIPLE * self.reference_noise
            and self.loss < self.reference_start
        )

    @property
    def settled_step(self) -> int | None:
        """The step (1-based) from which float32's smoothed loss stays within what a reference
        that did not learn would fall (``REFERENCE_MIN_DROP`` of its final loss, or
        ``REFERENCE_NOISE_MULTIPLE`` standard errors of it, the larger) above its final: past
        it, float32's last steps show nothing more. The target lies ``TARGET_TOLERANCE`` above
        float32's end, so on a loss that falls slowly for long (a language model's) it is
        reached long before this step; a run that stops there has not shown that it follows
        float32 down the rest of the way. ``None`` without float32's curve.

        Example:
            >>> from scalertune import Target
            >>> Target.from_reference([4.0 - 0.01 * i for i in range(200)]).settled_step
            198
        """
        curve = self.reference_curve
        if not curve:
            return None
        final = self.reference_final
        within = max(
            _judge_policy.REFERENCE_MIN_DROP * abs(final),
            _judge_policy.REFERENCE_NOISE_MULTIPLE * self.reference_noise,
        )
        above = [i for i, value in enumerate(curve) if not value - final <= within]
        return above[-1] + 2 if above else 1

    def check_learned(self, steps: int) -> None:
        """Refuse a reference that did not learn: no run could be judged against it.

        Args:
            steps: The steps the reference trained (named in the message).

        Raises:
            UsageError: float32 did not lower its loss by a meaningful margin; the message says
                to raise ``--steps`` or the learning rate, or to check the loss and data.

        Example:
            >>> from scalertune import Target
            >>> Target.from_reference([1.0] * 20).check_learned(20)
            Traceback (most recent call last):
            ...
            scalertune._errors.UsageError: the float32 reference did not learn enough in 20 ...
        """
        if self.reference_learned:
            return
        start, final = self.reference_start, self.reference_final
        fell = (
            f"fell only {100 * (start - final) / abs(start):.2g}%"
            if start > final and start
            else "did not fall"
        )
        raise UsageError(
            f"the float32 reference did not learn enough in {steps} steps to judge runs "
            f"against: its smoothed loss {fell} ({start:.4g} -> {final:.4g}, noise "
            f"{self.reference_noise:.3g}), and the target, its end plus the tolerance "
            f"({self.loss:.4g}), must lie below where it started: raise --steps or the "
            "learning rate, or check the workload's loss and data"
        )

    def steps_to_target(self, losses: Sequence[float]) -> int | None:
        """Steps a run needed to reach the target: the first whose smoothed loss is at or below it.

        Args:
            losses: The run's loss at each step.

        Returns:
            The 1-based step count, or ``None`` if it never reached the target.

        Example:
            >>> from scalertune import Target
            >>> Target.from_reference([4.0] * 10 + [1.0] * 10).steps_to_target([4.0] * 20) is None
            True
        """
        for i, value in enumerate(smoothed(losses)):
            if value <= self.loss:
                return i + 1
        return None

    def relative(self, smoothed_loss: float) -> float:
        """A smoothed loss as orders of magnitude from the target: log10(loss / target).

        0 is the target, 1 ten times above it, -1 a tenth of it. Runs whose losses start
        thousands of times above the target and end just below it read on one linear axis, the
        dashboard's.

        Args:
            smoothed_loss: A run's smoothed loss.

        Returns:
            The log ratio; the raw loss when the target is <= 0; NaN where the log is undefined.

        Example:
            >>> from scalertune import Target
            >>> Target.from_reference([4.0] * 10 + [1.0] * 10).relative(11.0)
            1.0
        """
        if self.loss <= 0:
            return smoothed_loss
        if not smoothed_loss > 0:
            return math.nan
        return math.log10(smoothed_loss / self.loss)

    def ratio_at(self, losses: Sequence[float]) -> tuple[float, int]:
        """The run's smoothed loss over float32's at the run's last step, and that step.

        Runs stop at different steps; the ratio is taken where both exist.

        Args:
            losses: The run's loss at each step.

        Returns:
            ``(ratio, step)``, the step 1-based; ``inf`` for a loss that is not finite.

        Example:
            >>> from scalertune import Target
            >>> Target.from_reference([4.0] * 10 + [1.0] * 10).ratio_at([1.0] * 20)
            (1.0, 20)
        """
        curve = smoothed(losses)
        if not curve:
            return math.inf, 0
        step = min(len(curve), len(self.reference_curve)) if self.reference_curve else len(curve)
        mine = curve[step - 1]
        theirs = self.reference_curve[step - 1] if self.reference_curve else self.reference_final
        if not math.isfinite(mine):
            return math.inf, step
        if theirs == 0:
            return (1.0 if mine == 0 else math.inf), step
        return mine / theirs, step

    def gap(self, losses: Sequence[float]) -> float:
        """How far the best smoothed loss stayed above the target, relative to the target.

        Stored as Optuna's constraint: <= 0 means the run reached the target.

        Args:
            losses: The run's loss at each step.

        Returns:
            The relative gap; ``inf`` where no smoothed loss is finite.

        Example:
            >>> from scalertune import Target
            >>> round(Target.from_reference([4.0] * 10 + [1.0] * 10).gap([0.55] * 20), 3)
            -0.5
        """
        curve = [v for v in smoothed(losses) if math.isfinite(v)]
        if not curve:
            return math.inf
        return (min(curve) - self.loss) / max(abs(self.loss), 1e-12)
