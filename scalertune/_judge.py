"""Judging a run against the float32 reference: did it reach the target, and how fast?

The **float32 reference** is the same workload, same seed, without autocast. Its smoothed loss
at the last step, plus a small tolerance (``TARGET_TOLERANCE`` of it), is the **target**. A run
*reaches the target* at the first step where its own smoothed loss is at or below it; its
**time to target** is that step count times its median step time. A run whose loss stays flat
(gradients flushed to zero by too small a scale) or that skips too many steps never reaches it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from scalertune import _policy


def smoothed(losses: Sequence[float]) -> list[float]:
    """Trailing mean over ``SMOOTHING_STEPS`` (fewer at the start); NaN where any is non-finite."""
    out, window = [], _policy.SMOOTHING_STEPS
    for i in range(len(losses)):
        chunk = losses[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk) if all(map(math.isfinite, chunk)) else math.nan)
    return out


@dataclasses.dataclass(frozen=True)
class Target:
    """The loss a run must reach to count as training as well as float32."""

    loss: float
    reference_final: float
    reference_start: float

    @classmethod
    def from_reference(cls, losses: Sequence[float]) -> "Target":
        curve = smoothed(losses)
        start = curve[min(len(curve), _policy.SMOOTHING_STEPS) - 1]
        final = curve[-1]
        return cls(loss=final + _policy.TARGET_TOLERANCE * abs(final),
                   reference_final=final, reference_start=start)

    @property
    def reference_learned(self) -> bool:
        """Whether float32 reduced the loss at all; without that, the target says nothing."""
        return self.reference_start > self.reference_final

    def steps_to_target(self, losses: Sequence[float]) -> int | None:
        """Steps a run needed to reach the target (1-based count), or ``None`` if never."""
        for i, value in enumerate(smoothed(losses)):
            if value <= self.loss:
                return i + 1
        return None

    def final_ratio(self, losses: Sequence[float]) -> float:
        """The run's final smoothed loss over float32's (1.0 = as good as float32)."""
        curve = smoothed(losses)
        if not curve or not math.isfinite(curve[-1]):
            return math.inf
        if self.reference_final == 0:
            return 1.0 if curve[-1] == 0 else math.inf
        return curve[-1] / self.reference_final

    def gap(self, losses: Sequence[float]) -> float:
        """How far the best smoothed loss stayed above the target, relative to the target
        (<= 0 means it reached the target). Stored as Optuna's constraint."""
        curve = [v for v in smoothed(losses) if math.isfinite(v)]
        if not curve:
            return math.inf
        return (min(curve) - self.loss) / max(abs(self.loss), 1e-12)


def speed_verdict(speedup: float, step_time_ratio: float, device: str) -> str:
    """The sentence that states a config's speed against float32 on this device.

    ``speedup`` is float32's time to target over the config's; ``step_time_ratio`` is the
    config's median step time over float32's. Both are stated, because a config can reach the
    target in fewer steps (clipping, say) while each of its steps is slower.
    """
    per_step = (f"each step {step_time_ratio:.2f}x float32's time"
                if math.isfinite(step_time_ratio) else "step time unknown")
    if abs(speedup - 1) <= _policy.SAME_SPEED_BAND:
        text = f"about as fast as float32 to the target on {device} ({speedup:.2f}x; {per_step})"
    elif speedup > 1:
        text = f"{speedup:.2f}x faster than float32 to the target on {device} ({per_step})"
    else:
        text = f"{1 / speedup:.2f}x slower than float32 to the target on {device} ({per_step})"
    if device.startswith("cpu") and step_time_ratio > 1 + _policy.SAME_SPEED_BAND:
        text += (". CPUs without native half-precision matmul run AMP steps slower than "
                 "float32; to choose for GPU training, run the search on that GPU")
    return text
