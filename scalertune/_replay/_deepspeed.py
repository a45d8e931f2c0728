"""DeepSpeed's dynamic loss scaler (0.19), exactly, and its replay over a gradient trace.

**The rule** (``deepspeed/runtime/fp16/loss_scaler.py``, ``DynamicLossScaler.update_scale``,
which ZeRO stages 1 to 3 use). The scale is a Python float (double), starting at
``2**initial_scale_power``. On an overflow (the step is skipped):

- with ``hysteresis`` (``delayed_shift``) 1, or once the remaining hysteresis is down to 1,
  the scale halves, but never below ``min_loss_scale``; an overflow *at* ``min_loss_scale``
  raises instead and ends training;
- otherwise only the remaining hysteresis drops by one: the scale stays.

On a good step the scale doubles when ``step - last_overflow_step - 1`` is a positive multiple
of ``loss_scale_window``: after ``window + 1`` good steps, then every ``window`` (the count
does not restart at a growth, unlike GradScaler's). The remaining hysteresis refills to
``hysteresis`` at a growth, or with ``consecutive_hysteresis`` at every good step.

One more way it ends a run: the overflow line it logs formats ``int(scale)``, and a scale
that has doubled past float64's range (1,024 growths without an overflow, e.g. a window of 1
on gradients that never overflow) is inf, so the next overflow raises ``OverflowError``.

Without ZeRO, DeepSpeed's ``FP16_Optimizer`` updates the scale itself: the same halving and
doubling, but no hysteresis, no error at the minimum (it stays there), and no log line (an
infinite scale stays inf, and every step overflows). ``zero=False`` replays that.

Overflow is decided as for GradScaler (:func:`~scalertune._replay._gradscaler.limits`): step
``t`` overflows when ``scale >= 65520 / amax[t]``. DeepSpeed's fp16 mode runs every
activation in half precision, not autocast's op lists, so the gradients that overflow can be
others than the float32 reference's trace saw: the rule here is exact, the amax model was
calibrated for autocast only.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scalertune._amp._config import DeepSpeedFp16Config
from scalertune._errors import ParameterError, UsageError
from scalertune._replay._gradscaler import limits, seen_limit

#: Why a replay ends early, as :attr:`DeepSpeedReplay.raised` says it.
AT_MINIMUM = "an overflow at min_loss_scale (DeepSpeed raises: cannot decrease scale anymore)"
AT_INFINITY = "an overflow with the scale grown to inf (OverflowError in DeepSpeed's log line)"


@dataclasses.dataclass(frozen=True)
class DeepSpeedScaler:
    """The settings of DeepSpeed's dynamic loss scaler (``DynamicLossScaler``'s arguments; a
    config's ``fp16`` block calls ``scale_window`` ``loss_scale_window``, ``min_scale``
    ``min_loss_scale`` and ``delayed_shift`` ``hysteresis``, and sets ``init_scale`` as
    ``2**initial_scale_power``).

    ``zero``: ZeRO's ``DynamicLossScaler`` (True), or ``FP16_Optimizer``'s own update without
    ZeRO (False), which ignores ``delayed_shift`` and ``raise_error_at_min_scale``.

    Example:
        >>> DeepSpeedScaler.from_fp16_block({"enabled": True, "initial_scale_power": 12,
        ...                                  "hysteresis": 1}).init_scale
        4096.0
    """

    init_scale: float = 2.0**16
    scale_window: int = 1000
    min_scale: float = 1.0
    delayed_shift: int = 2
    consecutive_hysteresis: bool = False
    raise_error_at_min_scale: bool = True
    zero: bool = True

    @classmethod
    def from_fp16_block(cls, block: Mapping[str, Any], *, zero: bool = True) -> DeepSpeedScaler:
        """The scaler a DeepSpeed config's ``fp16`` block sets up (its keys as DeepSpeed reads
        them, DeepSpeed's own values where absent). Only an enabled block with dynamic
        scaling (``loss_scale`` 0) has a scaler to replay."""
        try:
            config = DeepSpeedFp16Config.from_fp16_block(block, name="fp16_block")
        except UsageError as exc:
            problem = str(exc).removeprefix("fp16_block").lstrip()
            raise ParameterError("fp16_block", problem) from None
        return cls.from_config(config, zero=zero)

    @classmethod
    def from_config(cls, config: DeepSpeedFp16Config, *, zero: bool = True) -> DeepSpeedScaler:
        """The scaler of a DeepSpeed fp16 config (what a search of a DeepSpeed workload tries)."""
        return cls(
            init_scale=float(config.init_scale),
            scale_window=config.growth_interval,
            min_scale=float(config.min_loss_scale),
            delayed_shift=config.hysteresis,
            consecutive_hysteresis=config.consecutive_hysteresis,
            zero=zero,
        )


class _Rule:
    """``DynamicLossScaler.update_scale`` (or ``FP16_Optimizer._update_scale``), step by step."""

    def __init__(self, scaler: DeepSpeedScaler) -> None:
        self.s = scaler
        self.scale = float(scaler.init_scale)
        self.hysteresis = scaler.delayed_shift
        self.last_overflow = -1

    def update(self, overflow: bool, step: int) -> str | None:
        """Update after step ``step``; the reason DeepSpeed raises there instead, if it does."""
        s = self.s
        if overflow:
            if s.zero and math.isinf(self.scale):
                return AT_INFINITY
            if not s.zero or s.delayed_shift == 1 or self.hysteresis == 1:
                if s.zero and s.raise_error_at_min_scale and self.scale == s.min_scale:
                    return AT_MINIMUM
                self.scale = max(self.scale / 2.0, s.min_scale)
            else:
                self.hysteresis -= 1
            self.last_overflow = step
            return None
        if s.zero and s.consecutive_hysteresis:
            self.hysteresis = s.delayed_shift
        stable = step - self.last_overflow - 1
        if stable > 0 and stable % s.scale_window == 0:
            if s.zero and not s.consecutive_hysteresis:
                self.hysteresis = s.delayed_shift
            self.scale *= 2.0
        return None


def update_deepspeed_scales(
    overflows: Sequence[bool], scaler: DeepSpeedScaler
) -> tuple[np.ndarray, int | None]:
    """DeepSpeed's scale after the update of each step, given which steps overflowed, and the
    step at which it raises instead (``None`` if it does not; the scales stop there)."""
    rule = _Rule(scaler)
    out: list[float] = []
    for step, overflow in enumerate(overflows):
        if rule.update(bool(overflow), step) is not None:
            return np.array(out, dtype=np.float64), step
        out.append(rule.scale)
    return np.array(out, dtype=np.float64), None


@dataclasses.dataclass(frozen=True, eq=False)
class DeepSpeedReplay:
    """What DeepSpeed's scaler does over a trace."""

    #: The steps it skips (every overflow, hysteresis or not), ascending; a step it raises at
    #: is the last.
    skipped: np.ndarray
    min_scale: float
    final_scale: float
    #: The step at which DeepSpeed raises and training ends, and why (see the module's
    #: docstring); ``None`` when it runs to the end.
    raised_at: int | None = None
    raised: str | None = None
    #: The scale in effect during each step, when asked for (NaN after a raise).
    scales: np.ndarray | None = None
    #: Where the scaler ends: the hysteresis left, and the step of its last overflow (-1:
    #: none), as ``DynamicLossScaler`` holds them (``cur_hysteresis``,
    #: ``last_overflow_iter``).
    hysteresis: int = 0
    last_overflow: int = -1


def replay_deepspeed(
    amax: np.ndarray,
    scaler: DeepSpeedScaler,
    *,
    startup: np.ndarray | None = None,
    per_step: bool = False,
    lag: bool = True,
) -> DeepSpeedReplay:
    """DeepSpeed's scaler over the trace ``amax``, step by step. ``startup`` and ``lag`` read
    the trace as :func:`~scalertune._replay._gradscaler.replay` does: a skipped step leaves
    the weights where they were, whichever scaler skipped it."""
    limit = limits(amax).tolist()
    probe = limits(startup).tolist() if startup is not None and len(startup) else []
    rule = _Rule(scaler)
    skipped: list[int] = []
    lowest = rule.scale
    scales = np.full(len(limit), np.nan) if per_step else None
    raised_at = raised = None
    for t in range(len(limit)):
        if scales is not None:
            scales[t] = rule.scale
        overflow = rule.scale >= (
            seen_limit(limit, probe, t, len(skipped), lag) if probe else limit[t]
        )
        if overflow:
            skipped.append(t)
        raised = rule.update(overflow, t)
        if raised is not None:
            raised_at = t
            break
        lowest = min(lowest, rule.scale)
    return DeepSpeedReplay(
        np.array(skipped, dtype=np.int64),
        lowest,
        rule.scale,
        raised_at,
        raised,
        scales,
        hysteresis=rule.hysteresis,
        last_overflow=rule.last_overflow,
    )


def replay_fp16_block(
    amax: np.ndarray,
    fp16_block: Mapping[str, Any],
    *,
    startup: np.ndarray | None = None,
    zero: bool = True,
    per_step: bool = False,
) -> DeepSpeedReplay:
    """:func:`replay_deepspeed` of the scaler a DeepSpeed config's ``fp16`` block sets up
    (the block ``scalertune export --to deepspeed`` writes, or any other)."""
    return replay_deepspeed(
        amax,
        DeepSpeedScaler.from_fp16_block(fp16_block, zero=zero),
        startup=startup,
        per_step=per_step,
    )
