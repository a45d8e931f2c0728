"""Beyond the horizon: when a module's forward outputs, at their trend, would reach
float16's range.

Activations that grow with training run float16's range out late: an overflow that no
trial, and no phase of the horizon, meets yet. The float32 reference's trace keeps each
module's largest forward output per block of steps; over the second half of the horizon the
log2 of that peak is fitted against the step (least squares). Where the slope is positive
and significant (``FORECAST_T`` standard errors), and the later half of those blocks grows at
least half as fast as the earlier half (no levelling off), the step at which the line reaches
65504 is the forecast, with the range the slope's uncertainty gives. It is a forecast, not a
promise: training rarely grows at one rate, and bfloat16 has no such limit.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from scalertune import _policy
from scalertune._replay._trace import Trace


@dataclasses.dataclass(frozen=True)
class Forecast:
    """When ``module``'s forward peak would reach float16's largest value at its trend."""

    module: str
    step: float
    earliest: float
    latest: float
    peak: float

    def describe(self) -> str:
        latest = "later" if math.isinf(self.latest) else f"{self.latest:,.0f}"
        return (
            f"module {self.module}'s activations (now up to {self.peak:.3g}) reach 65504 "
            f"near step ~{self.step:,.0f} at this rate (between {self.earliest:,.0f} and "
            f"{latest}); bfloat16 has no such limit"
        )


def forecast(trace: Trace, horizon: int) -> list[Forecast]:
    """The modules whose forward peaks trend toward float16's range beyond ``horizon``,
    soonest first; empty where no trend is significant."""
    rows = trace.block_starts >= horizon / 2
    if rows.sum() < _policy.FORECAST_MIN_BLOCKS or not trace.modules:
        return []
    steps = trace.block_starts[rows].astype(np.float64)
    out = []
    for i, module in enumerate(trace.modules):
        peaks = trace.forward[rows, i].astype(np.float64)
        keep = peaks > 0
        if keep.sum() < _policy.FORECAST_MIN_BLOCKS or peaks.max() >= _policy.FLOAT16_MAX:
            continue
        x, y = steps[keep], np.log2(peaks[keep])
        found = _fit(x, y, module, float(peaks.max()))
        if found is not None and found.step > horizon and _sustained(x, y):
            out.append(found)
    return sorted(out, key=lambda f: f.step)


def _sustained(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether the growth keeps its rate: the slope over the later half of the points is at
    least ``FORECAST_SUSTAINED`` of the slope over the earlier half. A peak that levels off
    (an output approaching the size of its targets) must not be extrapolated."""
    half = len(x) // 2
    early = np.polyfit(x[:half], y[:half], 1)[0]
    late = np.polyfit(x[half:], y[half:], 1)[0]
    return bool(late > 0 and late >= _policy.FORECAST_SUSTAINED * early)


def _fit(x: np.ndarray, y: np.ndarray, module: str, peak: float) -> Forecast | None:
    n = len(x)
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    spread = float(np.sum((x - x.mean()) ** 2))
    error = math.sqrt(float(np.sum(residual**2)) / (n - 2) / spread) if spread else math.inf
    if slope <= 0 or slope < _policy.FORECAST_T * error:
        return None
    limit = math.log2(_policy.FLOAT16_MAX)

    def reach(rate: float) -> float:
        return (limit - intercept) / rate if rate > 0 else math.inf

    low, high = slope + 2 * error, slope - 2 * error
    return Forecast(
        module=module, step=reach(slope), earliest=reach(low), latest=reach(high), peak=peak
    )
