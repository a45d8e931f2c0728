"""The verdict against float32: how much faster (or slower) to the target, with its spread."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

#: Why AMP loses to float32 on a CPU: the one wording of it, in :meth:`Speedup.cpu_note` and
#: in the verdict that answers float32 there.
CPU_SLOWER = "CPUs without native half-precision matmul run AMP steps slower than float32"

#: What a search says of float8's speed where torchao emulates it.
EMULATED = "emulated: float8's numerics without float8 matmuls; no speed claimed"


def emulated(device: str) -> bool:
    """Whether a search on ``device`` (in words, as a study records it) timed float8
    emulated: anywhere but CUDA (a search refuses float8 on a GPU without float8 matmuls)."""
    return not device.startswith("cuda")


@dataclasses.dataclass(frozen=True)
class Speedup:
    """float32's time to target over a config's: a point estimate and the spread around it.

    ``low``/``high`` combine the spread of the interleaved step-time ratios over the timing
    rounds (:func:`scalertune._run._step_times.spread`) with the range of the
    steps-to-target ratios over the seeds the config ran on. A speedup whose spread holds 1
    is a tie with float32.

    Example:
        >>> from scalertune import Speedup
        >>> Speedup.of([1.0, 1.2], [0.5, 0.6])
        Speedup(point=2.0, low=1.6666666666666667, high=2.4, step_time_ratio=0.55)
    """

    point: float
    low: float
    high: float
    step_time_ratio: float

    @classmethod
    def of(cls, step_ratios: Sequence[float], time_ratios: Sequence[float]) -> Speedup:
        """The speedup from its two measurements.

        Args:
            step_ratios: float32's steps to target over the config's, per seed.
            time_ratios: The config's step time over float32's, per timing round.

        Returns:
            The speedup: the median step ratio over the median time ratio, with the spread.

        Example:
            >>> from scalertune import Speedup
            >>> Speedup.of([1.0], [0.5]).point
            2.0
        """
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
        """The sentence that states this speed against float32 on ``device``.

        Args:
            device: The device in words (``"cuda:0 (NVIDIA H100)"``, ``"cpu (x86_64, 2 threads)"``).
            note: Add :meth:`cpu_note` (why AMP is slower on a CPU).

        Returns:
            The sentence: faster, slower, or as fast within measurement noise.

        Example:
            >>> from scalertune import Speedup
            >>> print(Speedup.of([1.0, 1.2], [0.5, 0.6]).verdict("cuda"))
            2.00x faster than float32 to the target on cuda (1.67-2.40x of float32's speed; ...)
        """
        spread = f"{self.low:.2f}-{self.high:.2f}x of float32's speed"
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
                f"({spread}; {per_step})"
            )
        return text + (self.cpu_note(device) if note else "")

    def cpu_note(self, device: str) -> str:
        """Why AMP is slower here, when it is, on a CPU.

        Args:
            device: The device in words.

        Returns:
            The note (starting ``". "``), or ``""`` off a CPU or where AMP is not slower.

        Example:
            >>> from scalertune import Speedup
            >>> Speedup.of([1.0], [0.5]).cpu_note("cpu")
            ''
        """
        if device.startswith("cpu") and self.step_time_ratio > 1:
            return f". {CPU_SLOWER}; to choose for GPU training, run the search on that GPU"
        return ""
