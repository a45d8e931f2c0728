"""What one run did, step by step: the evidence every judgement is made from."""

from __future__ import annotations

import dataclasses
import math
import statistics
import struct
from collections.abc import Callable, Sequence
from typing import Any

from scalertune import _policy
from scalertune._amp._config import AmpConfig

#: Prune kinds, in the words the summary and the dashboard use.
PRUNE_KINDS = {
    "forward": "forward overflow",
    "diverged": "diverged",
    "parameters": "non-finite weights",
    "gradients": "gradients non-finite every step",
    "scale-collapse": "scale collapse",
    "slower": "slower than the best",
    "behind": "fell behind after the target",
    "float8": "float8 loses a layer",
}


def as_float32(value: float) -> float:
    """``value`` rounded to float32, as GradScaler stores its scale."""
    return struct.unpack("f", struct.pack("f", value))[0]


def skipped_steps(scales: Sequence[float], init_scale: float) -> list[int]:
    """Indices of the steps GradScaler skipped, from the scale after each step.

    ``update()`` multiplies the scale by ``backoff_factor`` < 1 exactly when a step was
    skipped, so a smaller scale than the step before *is* a skipped step. The scaler keeps its
    scale in float32: the first step compares with ``init_scale`` rounded the same way (an
    init_scale float32 cannot hold exactly would otherwise look like a back-off at step 0).
    """
    out, previous = [], as_float32(init_scale)
    for i, scale in enumerate(scales):
        if scale < previous:
            out.append(i)
        previous = scale
    return out


@dataclasses.dataclass
class RunRecord:
    """What one run did, step by step: the evidence every judgement is made from."""

    config: AmpConfig
    seed: int
    steps: int
    losses: list[float] = dataclasses.field(default_factory=list)
    scales: list[float] = dataclasses.field(default_factory=list)
    window_step_times: list[float] = dataclasses.field(default_factory=list)
    prune_kind: str | None = None
    prune_reason: str | None = None
    #: Steps to the float32 target (1-based), once the stop rule has seen it reached.
    reached_at: int | None = None
    #: Why the run ended before ``steps``: "reached" (the target), or a prune kind.
    stopped: str | None = None
    #: The step of the training this run starts at: 0, or the step of the float32
    #: reference's checkpoint a branch (or a resumed reference) starts from.
    start: int = 0
    #: The loss scale the run's scaler started at: ``init_scale``, or for a branch where that
    #: config's scaler would be by then.
    initial_scale: float | None = None
    #: The gradient trace the run recorded (the float32 reference to the horizon), if any.
    trace: Any = None
    #: The steps an engine that decides its own skips said it skipped (DeepSpeed's, whose
    #: hysteresis skips a step without lowering the scale); ``None``: read off the scales.
    skipped_at: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data (its config's every field, its trace encoded): what a
        checkpoint holds (:mod:`scalertune._run._checkpoint_file`)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        config = self.config
        fields["config"] = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
        fields["trace"] = None if self.trace is None else self.trace.encode()
        return fields

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """What :meth:`to_dict` made."""
        from scalertune._replay._trace import Trace

        fields = dict(data)
        fields["config"] = AmpConfig(**fields["config"])
        fields["trace"] = None if fields["trace"] is None else Trace.decode(fields["trace"])
        return cls(**fields)

    @property
    def steps_run(self) -> int:
        return len(self.losses)

    @property
    def skipped(self) -> list[int]:
        """Indices of the steps GradScaler skipped (the scale shrank on them)."""
        if not self.config.uses_scaler:
            return []
        if self.skipped_at is not None:
            return list(self.skipped_at)
        start = self.config.init_scale if self.initial_scale is None else self.initial_scale
        return skipped_steps(self.scales, start)

    @property
    def first_nonfinite_step(self) -> int | None:
        """The first step whose loss or gradients were inf/NaN (0-based), if any."""
        bad_loss = next((i for i, v in enumerate(self.losses) if not math.isfinite(v)), None)
        skipped = self.skipped
        candidates = [s for s in (bad_loss, skipped[0] if skipped else None) if s is not None]
        return min(candidates) if candidates else None

    @property
    def median_step_time(self) -> float:
        """Median seconds per step over the windows after warm-up."""
        times = self.window_step_times[_policy.WARMUP_WINDOWS :] or self.window_step_times
        return statistics.median(times) if times else math.nan

    @property
    def pruned(self) -> bool:
        return self.prune_kind is not None


WindowCallback = Callable[[RunRecord, int], None]


#: Called after each window that left the run finite; returns True to stop the run there.
StopRule = Callable[[RunRecord], bool]
