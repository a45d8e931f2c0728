"""The float16 scaler setting the replay finds best over the horizon, against PyTorch's.

Short trials cannot choose GradScaler's knobs: ``growth_interval`` (PyTorch's 2000) never
acts in a 200-step trial, and where trials are long enough, a fraction of a percent in steps
to the target (noise) decides. The replay of GradScaler's update rule over the float32
reference's gradient trace (:mod:`scalertune._replay`) tells, for ``REPLAY_CONFIGS`` settings
drawn from the space at once, how many steps each would skip over the whole horizon, and
whether its scale would collapse (nothing is tried where the forward pass overflows
float16 with PyTorch's defaults: no scaler setting changes that). The fewest skips wins,
but it is trained (one real run checks it) only when it skips fewer than PyTorch's defaults
beyond the noise: the replay's own tolerance and float32's seed-to-seed spread of steps, over
the horizon. Otherwise the defaults are as good: keep them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from scalertune import _policy
from scalertune._amp._config import PYTORCH_DEFAULT, SCALER_KNOBS, AmpConfig
from scalertune._judge._rank import skip_tolerance
from scalertune._replay._gradscaler import replay_many
from scalertune._replay._predict import predict
from scalertune._replay._trace import Trace
from scalertune._review._result import SearchResult
from scalertune._search._setup import Setup


def replay_choice(result: SearchResult, setup: Setup) -> AmpConfig | None:
    """The float16 setting worth a real run (see the module's docstring), or ``None``."""
    ref = result.reference
    if "float16" not in setup.space.dtypes or not ref or not ref.get("trace"):
        return None
    base = _base(result, setup)
    default = result.baselines.get("pytorch-default")
    if (default is not None and default.prune_kind == "forward"
            and default.config.fp32_modules == base.fp32_modules):
        return None  # the forward pass overflows float16 whatever the scaler does
    trace = Trace.decode(ref["trace"])
    configs = [base, *_drawn(setup, base)]
    played = replay_many(trace.amax[:result.horizon], configs, startup=trace.startup)
    viable = [i for i in range(len(configs))
              if played.min_scale[i] >= _policy.SCALE_FLOOR
              and _flushed(trace, played.min_scale[i]) <= _policy.UNDERFLOW_SHARE]
    if not viable:
        return None
    best = configs[min(viable, key=lambda i: (played.n_skipped[i], configs[i].knobs_changed(
        setup.clip_norm)))]
    return best if worth_changing(trace, base, best, result) else None


def worth_changing(trace: Trace, defaults: AmpConfig, best: AmpConfig,
                   result: SearchResult) -> bool:
    """Whether ``best`` skips fewer steps than ``defaults`` over the horizon beyond the noise
    (or the defaults' scale collapses, or flushes the gradients, and ``best``'s does not)."""
    if best == defaults:
        return False
    ours, theirs = predict(trace, best, horizon=result.horizon), predict(
        trace, defaults, horizon=result.horizon)
    if theirs.min_scale < _policy.SCALE_FLOOR:
        return True
    saved = theirs.skipped_steps - ours.skipped_steps
    return saved > skip_tolerance(theirs.skipped_steps) and saved > result.spread * result.horizon


def _flushed(trace: Trace, scale: float) -> float:
    return trace.share_below(scale, _policy.FLOAT16_SMALLEST_SUBNORMAL / 2)


def _base(result: SearchResult, setup: Setup) -> AmpConfig:
    """PyTorch's defaults with the clip and islands of the best float16 run (or the
    workload's own clip and the space's fixed islands)."""
    run = next((o for o in result.pool if o.config.dtype == "float16"), None)
    if run is not None:
        return dataclasses.replace(PYTORCH_DEFAULT, clip_norm=run.config.clip_norm,
                                   fp32_modules=run.config.fp32_modules)
    return dataclasses.replace(PYTORCH_DEFAULT, clip_norm=setup.clip_norm,
                               fp32_modules=setup.space.fixed_islands)


def _drawn(setup: Setup, base: AmpConfig) -> list[AmpConfig]:
    """``REPLAY_CONFIGS`` scaler settings drawn from the space's float16 ranges."""
    rng = np.random.default_rng(setup.seed)
    params: Mapping[str, Any] = setup.space.params
    out = []
    for _ in range(_policy.REPLAY_CONFIGS):
        knobs = {k: _draw(rng, params.get(k), getattr(base, k)) for k in SCALER_KNOBS}
        knobs["growth_interval"] = int(round(knobs["growth_interval"]))
        out.append(dataclasses.replace(base, **knobs))
    return out


def _draw(rng: np.random.Generator, spec: Any, default: float) -> float:
    if spec is None:
        return default
    if not isinstance(spec, Mapping):
        return float(spec)
    low, high = float(spec["low"]), float(spec["high"])
    if spec.get("log"):
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))
    return float(rng.uniform(low, high))
