"""Step times per dtype, as the timing measured them: plain numbers, read without torch.

:mod:`scalertune._run._timing` measures them; the judging turns steps to target into time to
target with them, and a report reads them back from the study.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

#: A CPU whose load average per core is above this while the timing ran was busy with more
#: than the timing (whose own threads make about 1 per core).
BUSY_LOAD = 1.5


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """Seconds per step of each dtype, one figure per timing round.

    Example:
        >>> times = StepTimes({"float32": [1e-3, 1.2e-3], "bfloat16": [2e-3, 2.6e-3]}, steps=40)
        >>> times.ratios("bfloat16")
        [2.0, 2.166666666666667]
    """

    rounds: dict[str, list[float]]
    #: Training steps the timing ran (warm-up included): part of the search's cost.
    steps: int = 0
    #: On a CPU, the highest 1-minute load average per core seen while timing (the timing's
    #: own threads count in it); ``None`` where not measured.
    load: float | None = None
    #: On a CPU, the intra-op threads each timed step ran on; ``None`` where not measured.
    threads: int | None = None

    @property
    def busy(self) -> bool:
        """Whether the CPU was busy with more than the timing while it ran: its step times,
        and their ratios, may be far off (threads that wait on each other on a shared CPU
        slow one dtype's kernels more than another's)."""
        return self.load is not None and self.load > BUSY_LOAD

    def ratios(self, dtype: str) -> list[float]:
        """``dtype``'s step time over float32's, round by round.

        Args:
            dtype: ``"float16"``, ``"bfloat16"`` or ``"float32"``, as timed.

        Returns:
            One ratio per timing round (below 1: faster than float32).

        Raises:
            KeyError: ``dtype`` was not timed.

        Example:
            >>> StepTimes({"float32": [1.0, 2.0], "float16": [0.5, 0.8]}).ratios("float16")
            [0.5, 0.4]
        """
        return [a / b for a, b in zip(self.rounds[dtype], self.rounds["float32"])]

    def ratio(self, dtype: str) -> float:
        """``dtype``'s step time over float32's: the median of the per-round ratios.

        Interleaved rounds see the same load, so their ratio holds where the seconds do not.

        Args:
            dtype: A timed dtype.

        Returns:
            The median ratio.

        Raises:
            KeyError: ``dtype`` was not timed.

        Example:
            >>> StepTimes({"float32": [1.0, 2.0], "float16": [0.5, 0.8]}).ratio("float16")
            0.45
        """
        return statistics.median(self.ratios(dtype))

    def median(self, dtype: str) -> float:
        """``dtype``'s seconds per step: float32's median times :meth:`ratio`.

        Args:
            dtype: A timed dtype.

        Returns:
            Seconds per step.

        Raises:
            KeyError: ``dtype`` was not timed.

        Example:
            >>> StepTimes({"float32": [1.0, 2.0], "float16": [0.5, 0.8]}).median("float16")
            0.675
        """
        return statistics.median(self.rounds["float32"]) * self.ratio(dtype)

    def bounds(self, dtype: str) -> tuple[float, float]:
        """The spread of ``dtype``'s step time, in seconds per step.

        Its median, scaled by the :func:`spread` of its per-round ratios to float32 over their
        median: a single round hit by a burst of load does not widen it (with 5 rounds or more),
        a machine noisy throughout does.

        Args:
            dtype: A timed dtype.

        Returns:
            ``(low, high)`` seconds per step.

        Raises:
            KeyError: ``dtype`` was not timed.

        Example:
            >>> StepTimes({"float32": [1.0, 2.0], "float16": [0.5, 0.8]}).bounds("float16")
            (0.6, 0.75)
        """
        low, high = spread(self.ratios(dtype))
        middle, point = self.ratio(dtype), self.median(dtype)
        return point * low / middle, point * high / middle

    def __contains__(self, dtype: object) -> bool:
        return dtype in self.rounds

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as the study stores it.

        Returns:
            ``rounds`` and ``steps`` (and ``load`` and ``threads``, where measured).

        Example:
            >>> StepTimes({"float32": [1.0]}, steps=40).to_dict()
            {'rounds': {'float32': [1.0]}, 'steps': 40}
        """
        measured = {
            k: v for k, v in (("load", self.load), ("threads", self.threads)) if v is not None
        }
        return {"rounds": self.rounds, "steps": self.steps, **measured}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepTimes:
        """Read what :meth:`to_dict` wrote.

        Args:
            data: ``rounds`` (and ``steps``; 0 where a study has none).

        Returns:
            The step times.

        Example:
            >>> StepTimes.from_dict({"rounds": {"float32": [1]}}) == StepTimes({"float32": [1.0]})
            True
        """
        load, threads = data.get("load"), data.get("threads")
        return cls(
            rounds={k: [float(v) for v in vs] for k, vs in data["rounds"].items()},
            steps=int(data.get("steps", 0)),
            load=None if load is None else float(load),
            threads=None if threads is None else int(threads),
        )


def spread(values: Sequence[float]) -> tuple[float, float]:
    """The range of ``values`` without its lowest and highest when there are 5 or more: a
    single window hit by a burst of load does not widen it, a machine noisy throughout does."""
    ordered = sorted(values)
    if len(ordered) >= 5:
        ordered = ordered[1:-1]
    return ordered[0], ordered[-1]
