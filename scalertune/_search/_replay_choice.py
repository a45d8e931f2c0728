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
the horizon. Otherwise the defaults are as good: keep them. (The replay stops each drawn
setting once it skips more than the defaults: it can no longer win.)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from scalertune import _policy
from scalertune._amp._config import PYTORCH_DEFAULT, SCALER_KNOBS, AmpConfig
from scalertune._judge._rank import skip_tolerance
from scalertune._replay._gradscaler import ReplayMany, replay, replay_many
from scalertune._replay._predict import predict
from scalertune._replay._trace import Trace
from scalertune._review._result import SearchResult
from scalertune._search import _policy as _search_policy
from scalertune._search._setup import Setup


def replay_choice(result: SearchResult, setup: Setup) -> AmpConfig | None:
    """The float16 setting worth a real run (see the module's docstring), or ``None``."""
    trace = result.trace
    if "float16" not in setup.space.dtypes or trace is None:
        return None
    base = _base(result, setup)
    default = result.baselines.get("pytorch-default")
    if (
        default is not None
        and default.prune_kind == "forward"
        and default.config.fp32_modules == base.fp32_modules
    ):
        return None  # the forward pass overflows float16 whatever the scaler does
    best = fewest_skips(trace, base, [base, *_drawn(setup, base)], result.horizon, setup.clip_norm)
    return best if best is not None and worth_changing(trace, base, best, result) else None


def fewest_skips(
    trace: Trace, base: AmpConfig, configs: list[AmpConfig], horizon: int, clip_norm: float | None
) -> AmpConfig | None:
    """The viable config of ``configs`` (scale above the floor, gradients not flushed) that
    skips fewest steps over ``horizon`` in the replay, the one with the fewest knobs changed
    among equals; ``None`` if none is viable. Where ``base`` (one of ``configs``) is viable,
    no config that skips more can win, so the replay stops those as they pass its count."""
    amax = trace.amax[:horizon]
    alone = replay(amax, base, startup=trace.startup, lag=False)
    bound = len(alone.skipped) if keeps_gradients(trace, alone.min_scale) else None
    return pick(
        trace,
        configs,
        replay_many(amax, configs, startup=trace.startup, stop_above=bound),
        clip_norm,
    )


def pick(
    trace: Trace, configs: list[AmpConfig], played: ReplayMany, clip_norm: float | None
) -> AmpConfig | None:
    """Of ``configs`` as ``played``, the viable one (not stopped, its gradients kept) that
    skips fewest steps, then changes fewest knobs; ``None`` if none is viable."""
    viable = [
        i
        for i in range(len(configs))
        if not played.stopped[i] and keeps_gradients(trace, played.min_scale[i])
    ]
    if not viable:
        return None
    return configs[
        min(viable, key=lambda i: (played.n_skipped[i], configs[i].knobs_changed(clip_norm)))
    ]


def worth_changing(
    trace: Trace, defaults: AmpConfig, best: AmpConfig, result: SearchResult
) -> bool:
    """Whether ``best`` skips fewer steps than ``defaults`` over the horizon beyond the noise
    (or the defaults' scale collapses, or flushes the gradients, and ``best``'s does not)."""
    if best == defaults:
        return False
    ours, theirs = (
        predict(trace, best, horizon=result.horizon),
        predict(trace, defaults, horizon=result.horizon),
    )
    if theirs.min_scale < _policy.SCALE_FLOOR:
        return True
    return _beyond_noise(theirs.skipped_steps - ours.skipped_steps, theirs.skipped_steps, result)


def differs(trace: Trace, defaults: AmpConfig, other: AmpConfig, result: SearchResult) -> bool:
    """Whether the replay tells ``other`` from ``defaults`` over the horizon: either skips
    fewer steps than the other beyond the noise, or exactly one of their scales collapses
    below the floor. Where it cannot, a real run of ``other`` would only repeat the
    defaults' (within the noise every comparison of the search allows)."""
    ours, theirs = (
        predict(trace, other, horizon=result.horizon),
        predict(trace, defaults, horizon=result.horizon),
    )
    if (ours.min_scale < _policy.SCALE_FLOOR) != (theirs.min_scale < _policy.SCALE_FLOOR):
        return True
    fewer, more = sorted((ours.skipped_steps, theirs.skipped_steps))
    return _beyond_noise(more - fewer, more, result)


def _beyond_noise(saved: int, skipped: int, result: SearchResult) -> bool:
    """Whether ``saved`` of ``skipped`` steps is more than the replay's tolerance and
    float32's seed spread of steps over the horizon."""
    return saved > skip_tolerance(skipped) and saved > result.spread * result.horizon


def keeps_gradients(trace: Trace, min_scale: float) -> bool:
    """Whether a scale that falls to ``min_scale`` stays above the floor and flushes no more
    than ``UNDERFLOW_SHARE`` of the trace's gradients to zero."""
    return (
        min_scale >= _policy.SCALE_FLOOR
        and trace.share_below(min_scale, _policy.FLOAT16_SMALLEST_SUBNORMAL / 2)
        <= _policy.UNDERFLOW_SHARE
    )


def _base(result: SearchResult, setup: Setup) -> AmpConfig:
    """PyTorch's defaults with the clip and islands of the best float16 run (or the
    workload's own clip and the space's fixed islands)."""
    run = next((o for o in result.pool if o.config.dtype == "float16"), None)
    if run is not None:
        return dataclasses.replace(
            PYTORCH_DEFAULT, clip_norm=run.config.clip_norm, fp32_modules=run.config.fp32_modules
        )
    return dataclasses.replace(
        PYTORCH_DEFAULT, clip_norm=setup.clip_norm, fp32_modules=setup.space.fixed_islands
    )


def _drawn(setup: Setup, base: AmpConfig) -> list[AmpConfig]:
    """``REPLAY_CONFIGS`` scaler settings drawn from the space's float16 ranges."""
    rng = np.random.default_rng(setup.seed)
    params: Mapping[str, Any] = setup.space.params
    out = []
    for _ in range(_search_policy.REPLAY_CONFIGS):
        # The scaler's knobs by name: AmpConfig checks each value.
        knobs: dict[str, Any] = {
            k: _draw(rng, params.get(k), getattr(base, k)) for k in SCALER_KNOBS
        }
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
