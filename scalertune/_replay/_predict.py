"""Prediction: what a config's loss scaler will do over the horizon, read off the float32
reference's gradient trace before any float16 run.

:func:`predict` replays GradScaler under the config over the trace (with the start-up probe
and the run's lag, :func:`~scalertune._replay._gradscaler.replay`): the steps it skips, the
scales it goes through, and, at those scales, the share of gradient values float16 would
flush to zero. :func:`predict_deepspeed` does the same for DeepSpeed's scaler set up by a
config's ``fp16`` block.

How close that comes, measured against real float16 runs (``benchmarks/replay_calibration.py``
has the figures): skip counts within ``max(2, 20%)`` for nearly every config of six workloads
over 2,000 steps, the start-up streak exact; the error comes from the real run's weights
drifting from the reference's once it has skipped steps the reference took, so *when* a late
skip happens is less certain than how many there are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from scalertune import _policy
from scalertune._amp._config import AmpConfig, DeepSpeedFp16Config
from scalertune._errors import ParameterError
from scalertune._replay._deepspeed import DeepSpeedScaler, replay_deepspeed
from scalertune._replay._gradscaler import replay
from scalertune._replay._trace import Trace
from scalertune._text import shown

#: Skipped steps a prediction lists by index: a start-up streak is rarely longer (the shipped
#: space's largest init_scale, 2**24, backs off to 2**4 in 20 steps at the default 0.5), and
#: past it the per-phase counts say where the rest fall.
SKIPS_LISTED = 20

#: The horizon is summarised in this many equal phases, the length of a phase window each.
PHASES = round(1 / _policy.PHASE_WINDOW_SHARE)


#: ``describe`` mentions flushing gradients once at least this share of the values flush in
#: some phase: below 1% flushing is the tail of tiny gradients that every scale loses.
FLUSH_WORTH_SAYING = 0.01

#: float16 rounds to nearest: below half its smallest subnormal a value becomes zero.
_FLUSH_BELOW = _policy.FLOAT16_SMALLEST_SUBNORMAL / 2


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What a config's loss scaler does over the first ``horizon`` steps, as replayed from the
    float32 reference's gradient trace.

    ``skipped_at`` lists the first :data:`SKIPS_LISTED` skipped steps and ``skipped_per_phase``
    counts them per tenth of the horizon. ``flushed`` is, per tenth, the share of the nonzero
    gradient values whose magnitude times the scale in effect falls below half of float16's
    smallest subnormal (``2**-24``): float16 rounds those to zero (NaN where the trace holds
    no histogram there). The first ``startup_span`` steps hold the ``startup_skips`` skips of the
    start-up burst. DeepSpeed can end training instead of skipping: ``stops_at`` and
    ``stop_reason`` say where and why.

    Example:
        >>> import numpy as np
        >>> from scalertune import AmpConfig
        >>> from scalertune._replay._trace import empty
        >>> trace = empty()
        >>> trace.amax = np.full(1000, 4.0, np.float32)  # each step's largest gradient
        >>> p = predict(trace, AmpConfig(init_scale=2.0**16, growth_interval=300))
        >>> p.skipped_at  # the start-up back-off, then one overflow per growth
        (0, 1, 2, 303, 604, 905)
        >>> print(p.describe())  # doctest: +ELLIPSIS
        skips 3 steps in the first 3, then 1 per 330: 6 of 1,000 (0.6%); lowest scale 2**13, ...
    """

    config: AmpConfig | DeepSpeedScaler
    horizon: int
    skipped_steps: int
    skipped_at: tuple[int, ...]
    skipped_per_phase: tuple[int, ...]
    min_scale: float
    final_scale: float
    flushed: tuple[float, ...]
    startup_skips: int = 0
    startup_span: int = 0
    stops_at: int | None = None
    stop_reason: str | None = None

    def describe(self) -> str:
        """One line: how many steps it skips and where, its scale range, and what ends or
        hurts the run (a DeepSpeed raise, flushing gradients)."""
        if isinstance(self.config, AmpConfig) and not self.config.uses_scaler:
            return f"{self.config.dtype}: no loss scaler, so no skipped step"
        if self.stops_at is None:
            text = (
                f"skips {self._skips()}; lowest scale {_power(self.min_scale)}, "
                f"final {_power(self.final_scale)}"
            )
        else:  # what it skips is of the steps it trains: none follow
            trained = self.stops_at + 1
            text = (
                f"skips {self.skipped_steps:,} of the {trained:,} steps it trains, down to scale "
                f"{_power(self.min_scale)}; DeepSpeed ends training at step {self.stops_at:,} "
                f"of {self.horizon:,}: {self.stop_reason}"
            )
        worst = max((s for s in self.flushed if not math.isnan(s)), default=0.0)
        if worst >= FLUSH_WORTH_SAYING:
            phase = self.flushed.index(worst) + 1
            text += f"; up to {worst:.0%} of gradient values flush to zero (tenth {phase})"
        return text

    def _skips(self) -> str:
        total, horizon = self.skipped_steps, self.horizon
        if total == 0:
            return f"no step of {horizon:,}"
        share = f"{total:,} of {horizon:,} ({_percent(total / horizon)})"
        if total == horizon:
            return f"every step: {share}"
        rest = total - self.startup_skips
        rate = f"1 per {_rounded((horizon - self.startup_span) / rest)}" if rest else "none"
        if not self.startup_skips:
            return f"{rate}: {share}"
        return (
            f"{self.startup_skips} step{'s' if self.startup_skips > 1 else ''} in the "
            f"first {self.startup_span:,}, then {rate}: {share}"
        )


def predict(
    trace: Trace, config: AmpConfig, *, horizon: int | None = None, zero: bool = True
) -> Prediction:
    """What GradScaler under ``config`` does over the first ``horizon`` steps (default: all
    the trace covers) of the training the trace was recorded on; for a DeepSpeed fp16
    config, DeepSpeed's scaler (under ZeRO with ``zero``: :func:`predict_deepspeed`).

    A bfloat16 or float32 config has no loss scaler: its prediction skips nothing, at scale
    1, and flushes nothing at float16's limit (bfloat16 keeps float32's exponent range), so
    that every config of a search space can be predicted alike.
    """
    if not isinstance(config, AmpConfig):
        raise ParameterError("config", f"must be an AmpConfig, got {type(config).__name__}")
    if isinstance(config, DeepSpeedFp16Config):
        return predict_deepspeed(trace, config.fp16_block(), horizon=horizon, zero=zero)
    horizon = _horizon(trace, horizon)
    if not config.uses_scaler:
        return Prediction(config, horizon, 0, (), (0,) * PHASES, 1.0, 1.0, (0.0,) * PHASES)
    run = replay(
        trace.amax[:horizon], config, startup=trace.startup, per_step=True, lag=trace.startup_whole
    )
    return _prediction(
        trace, config, horizon, run.skipped, run.min_scale, run.final_scale, run.scales
    )


def predict_deepspeed(
    trace: Trace, fp16_block: Mapping[str, Any], *, horizon: int | None = None, zero: bool = True
) -> Prediction:
    """What DeepSpeed's dynamic loss scaler, as a config's ``fp16`` block sets it up, does over
    the first ``horizon`` steps: under ZeRO (``zero=True``, stages 1 to 3) or without it
    (``FP16_Optimizer``; see :mod:`~scalertune._replay._deepspeed` for the difference)."""
    scaler = DeepSpeedScaler.from_fp16_block(fp16_block, zero=zero)
    horizon = _horizon(trace, horizon)
    run = replay_deepspeed(
        trace.amax[:horizon], scaler, startup=trace.startup, per_step=True, lag=trace.startup_whole
    )
    return dataclasses.replace(
        _prediction(
            trace, scaler, horizon, run.skipped, run.min_scale, run.final_scale, run.scales
        ),
        stops_at=run.raised_at,
        stop_reason=run.raised,
    )


def _prediction(
    trace: Trace,
    config: AmpConfig | DeepSpeedScaler,
    horizon: int,
    skipped: np.ndarray,
    lowest: float,
    final: float,
    scales: np.ndarray | None,
) -> Prediction:
    if scales is None:
        raise ValueError("a prediction needs the scale of each step: replay with per_step=True")
    per_phase = np.bincount(skipped * PHASES // horizon, minlength=PHASES)
    burst = _startup_burst(skipped, horizon)
    return Prediction(
        config=config,
        horizon=horizon,
        skipped_steps=len(skipped),
        skipped_at=tuple(int(t) for t in skipped[:SKIPS_LISTED]),
        skipped_per_phase=tuple(int(n) for n in per_phase),
        min_scale=float(lowest),
        final_scale=float(final),
        flushed=_flushed(trace, scales, horizon),
        startup_skips=burst,
        startup_span=int(skipped[burst - 1]) + 1 if burst else 0,
    )


def _startup_burst(skipped: np.ndarray, horizon: int) -> int:
    """How many skips make the start-up burst: from one in the first ``STARTUP_GAP`` steps,
    each within ``STARTUP_GAP`` of the one before, ending in the first half of the horizon (a
    config that skips that often throughout has no start-up of its own)."""
    if not len(skipped) or skipped[0] >= _policy.STARTUP_GAP:
        return 0
    apart = np.diff(skipped) > _policy.STARTUP_GAP
    count = int(np.argmax(apart)) + 1 if apart.any() else len(skipped)
    return count if skipped[count - 1] < horizon / 2 else 0


def _flushed(trace: Trace, scales: np.ndarray, horizon: int) -> tuple[float, ...]:
    """Per phase, the share of gradient values that round to zero in float16 (below half of
    its smallest subnormal) at the replayed scale. A histogram block sums the steps the trace
    sampled in it; its scale is the median scale in effect over the block's steps in the
    horizon (the scale is flat between a back-off and the next growth, so within a block the
    two rarely differ). Blocks weigh by their count of values; a block counts in every phase
    it overlaps."""
    starts = trace.block_starts.astype(np.int64)
    ends = np.append(starts[1:], trace.steps)
    shares, weights = np.full(len(starts), np.nan), trace.hist[:, 2:].sum(axis=1)
    for b, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
        in_effect = scales[start : min(end, horizon)]
        in_effect = in_effect[~np.isnan(in_effect)]
        if len(in_effect):
            shares[b] = trace.share_below(
                float(np.median(in_effect)), _FLUSH_BELOW, start, start + 1
            )
    out = []
    for phase in range(PHASES):
        low, high = horizon * phase // PHASES, horizon * (phase + 1) // PHASES
        mine = (starts < high) & (ends > low) & ~np.isnan(shares) & (weights > 0)
        out.append(
            float(np.average(shares[mine], weights=weights[mine])) if mine.any() else math.nan
        )
    return tuple(out)


def _horizon(trace: Trace, horizon: Any) -> int:
    steps = trace.steps
    horizon = steps if horizon is None else horizon
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise ParameterError("horizon", f"must be an integer >= 1, got {shown(horizon)}")
    if horizon > steps:
        raise ParameterError(
            "horizon",
            f"is {int(horizon):,} steps, but the trace covers "
            f"{steps:,}: a prediction cannot reach past the float32 reference "
            f"it replays; record the reference to {int(horizon):,} steps",
        )
    return int(horizon)


def _power(scale: float) -> str:
    """``2**-3`` for a power of two, ``2**-3.4`` otherwise."""
    if scale <= 0 or not math.isfinite(scale):
        return f"{scale:g}"
    power = math.log2(scale)
    return f"2**{power:.0f}" if power == round(power) else f"2**{power:.1f}"


def _percent(share: float) -> str:
    """Two significant digits below 10% (``0.064%``), whole percents above."""
    return f"{share * 100:.2g}%" if share < 0.1 else f"{share * 100:.0f}%"


def _rounded(value: float) -> int:
    """Two significant digits: "1 per 2000", not "1 per 2041.8"."""
    return round(float(f"{value:.2g}"))
