"""Beyond the horizon: when a module's forward outputs, at their trend, would reach
float16's range.

Activations that grow with training run float16's range out late: an overflow that no
trial, and no phase of the horizon, meets yet. The float32 reference's trace keeps each
module's largest forward output per block of steps. Over the second half of the horizon the
log2 of that peak is fitted against the log2 of the step (least squares): a **power of the
step**. Adam and its kin move each weight by about the learning rate per step at most, so a
weight grows at most in proportion to the step and a module's output, a product of a few
weights, at most as a power of it; growth that is exponential in the step, the straight line
in the step this module fitted before, would need updates that grow with the weights.
Measured against real float32 runs to 10 times the horizon (``benchmarks/forecast.py``: two
GPTs in nanoGPT's style, two MLPs whose activations grow with their weights' norm, a
regression MLP whose outputs climb toward its targets), the power of the step fitted over the
horizon's second half gave the real peaks within 0.85-1.7x at twice the horizon and 0.59-5.9x
at ten times (mostly above: a forecast that errs comes early); the straight line in the step
was up to 20,000 times too high there, and forecast 65504 at step 2,335 for a module whose
real peak there was 56.

It speaks only where the growth fits that model, and only as far as it was checked:

- the exponent is positive and ``FORECAST_T`` standard errors above zero, over at least
  ``FORECAST_MIN_BLOCKS`` blocks;
- the exponents over the earlier and the later half of those blocks agree within a factor
  ``FORECAST_STEADY``: an output levelling off (approaching the size of its targets) or
  speeding up (not a power of the step) is not extrapolated;
- the line reaches 65504 within ``FORECAST_REACH`` times the horizon, the reach it was
  measured over; further out it says nothing.

It is a forecast, not a promise: training rarely grows at one rate, and bfloat16 has no such
limit.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from scalertune import _policy
from scalertune._replay import _policy as _replay_policy
from scalertune._replay._trace import Trace


@dataclasses.dataclass(frozen=True)
class Trend:
    """``module``'s forward peak as a power of the step over the fitted blocks: through
    their centre (``log2`` of the step ``centre``, ``log2`` of the peak ``level``) with slope
    ``exponent`` in log-log, its standard error ``error``, and the largest peak seen."""

    module: str
    exponent: float
    centre: float
    level: float
    error: float
    peak: float
    #: Whether it keeps to one power over the fitted blocks (:func:`_steady`): only a steady
    #: trend is extrapolated.
    steady: bool = True

    def at(self, step: float, exponent: float | None = None) -> float:
        """The peak the line gives at ``step`` (with another ``exponent`` through the same
        centre: the range the exponent's error gives)."""
        rate = self.exponent if exponent is None else exponent
        return float(2.0 ** (self.level + rate * (math.log2(step) - self.centre)))

    def reaches(self, value: float, exponent: float | None = None) -> float:
        """The step at which the line (or one of another ``exponent`` through the same
        centre) reaches ``value``; ``inf`` when it never does."""
        rate = self.exponent if exponent is None else exponent
        if rate <= 0:
            return math.inf
        return float(2.0 ** (self.centre + (math.log2(value) - self.level) / rate))


@dataclasses.dataclass(frozen=True)
class Forecast:
    """When ``module``'s forward peak would reach float16's largest value at its trend."""

    module: str
    step: float
    earliest: float
    latest: float
    peak: float
    exponent: float

    def describe(self) -> str:
        latest = "later" if math.isinf(self.latest) else f"{self.latest:,.0f}"
        return (
            f"module {self.module}'s activations (now up to {self.peak:.3g}, growing as the "
            f"step to the power {self.exponent:.2g}) reach 65504 near step ~{self.step:,.0f} "
            f"at this rate (between {self.earliest:,.0f} and {latest}); bfloat16 has no such "
            "limit"
        )


def trends(trace: Trace, horizon: int) -> list[Trend]:
    """The modules whose forward peaks grow significantly over the second half of
    ``horizon``, each as a power of the step, in trace order; ``steady`` says whether it
    keeps to one power (see the module's docstring)."""
    rows = (trace.block_starts >= horizon / 2) & (trace.block_starts > 0)
    if rows.sum() < _replay_policy.FORECAST_MIN_BLOCKS or not trace.modules:
        return []
    # a block's peak is of its steps: placed at its middle
    steps = trace.block_starts[rows].astype(np.float64)
    width = float(np.median(np.diff(trace.block_starts))) if len(trace.block_starts) > 1 else 0
    out = []
    for i, module in enumerate(trace.modules):
        peaks = trace.forward[rows, i].astype(np.float64)
        keep = peaks > 0
        if keep.sum() < _replay_policy.FORECAST_MIN_BLOCKS or peaks.max() >= _policy.FLOAT16_MAX:
            continue
        x, y = np.log2(steps[keep] + width / 2), np.log2(peaks[keep])
        found = _fit(x, y, module, float(peaks.max()))
        if found is not None:
            out.append(dataclasses.replace(found, steady=_steady(x, y)))
    return out


def forecast(trace: Trace, horizon: int) -> list[Forecast]:
    """The modules whose forward peaks trend toward float16's range between ``horizon`` and
    ``FORECAST_REACH`` times it, soonest first; empty where no trend fits."""
    out = []
    limit, reach = _policy.FLOAT16_MAX, _replay_policy.FORECAST_REACH * horizon
    for trend in trends(trace, horizon):
        step = trend.reaches(limit)
        if not trend.steady:
            continue
        if not horizon < step <= reach:
            continue
        out.append(
            Forecast(
                module=trend.module,
                step=step,
                earliest=trend.reaches(limit, trend.exponent + 2 * trend.error),
                latest=trend.reaches(limit, trend.exponent - 2 * trend.error),
                peak=trend.peak,
                exponent=trend.exponent,
            )
        )
    return sorted(out, key=lambda f: f.step)


def _steady(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether the growth keeps to one power of the step: the exponents over the earlier
    and the later half of the points agree within ``FORECAST_STEADY`` (both positive). A
    peak that levels off or speeds up does not fit the model, and is not extrapolated."""
    half = len(x) // 2
    early = np.polyfit(x[:half], y[:half], 1)[0]
    late = np.polyfit(x[half:], y[half:], 1)[0]
    steady = _replay_policy.FORECAST_STEADY
    return bool(early > 0 and late > 0 and early / steady <= late <= early * steady)


def _fit(x: np.ndarray, y: np.ndarray, module: str, peak: float) -> Trend | None:
    n = len(x)
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    spread = float(np.sum((x - x.mean()) ** 2))
    error = math.sqrt(float(np.sum(residual**2)) / (n - 2) / spread) if spread else math.inf
    if slope <= 0 or slope < _replay_policy.FORECAST_T * error:
        return None
    centre = float(x.mean())
    return Trend(
        module=module,
        exponent=float(slope),
        centre=centre,
        level=float(slope * centre + intercept),
        error=error,
        peak=peak,
    )
