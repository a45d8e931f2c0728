"""The verdict against float32: how much faster (or slower) to the target, with its spread."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Speedup:
    """float32's time to target over a config's: a point estimate and the spread around it.

    ``low``/``high`` combine the spread of the interleaved step-time ratios over the timing
    rounds (:func:`scalertune._run._step_times.spread`) with the range of the steps-to-target ratios
    over the seeds the config ran on.
    """

    point: float
    low: float
    high: float
    step_time_ratio: float

    @classmethod
    def of(cls, step_ratios: Sequence[float], time_ratios: Sequence[float]) -> Speedup:
        """``step_ratios``: float32's steps to target over the config's, per seed;
        ``time_ratios``: the config's step time over float32's, per timing round."""
        from scalertune._run._step_times import spread

        steps = statistics.median(step_ratios)
        times = statistics.median(time_ratios)
        fast, slow = spread(time_ratios)
        return cls(
            point=steps / times,
            low=min(step_ratios) / slow,
            high=max(step_ratios) / fast,
            step_time_ratio=times,
        )

    def verdict(self, device: str, *, note: bool = True) -> str:
        """The sentence that states this speed against float32 on ``device`` (with
        ``note``, why AMP is slower on a CPU)."""
        spread = f"{self.low:.2f}-{self.high:.2f}x"
        per_step = f"each step {self.step_time_ratio:.2f}x float32's time"
        if self.low <= 1 <= self.high:
            text = (
                f"as fast as float32 to the target on {device} within measurement noise "
                f"({spread}; {per_step})"
            )
        elif self.low > 1:
            text = (
                f"{self.point:.2f}x faster than float32 to the target on {device} "
                f"({spread}; {per_step})"
            )
        else:
            text = (
                f"{1 / self.point:.2f}x slower than float32 to the target on {device} "
                f"({spread} of float32's speed; {per_step})"
            )
        return text + (self.cpu_note(device) if note else "")

    def cpu_note(self, device: str) -> str:
        """Why AMP is slower here, when it is on a CPU."""
        if device.startswith("cpu") and self.step_time_ratio > 1:
            return (
                ". CPUs without native half-precision matmul run AMP steps slower than "
                "float32; to choose for GPU training, run the search on that GPU"
            )
        return ""
