"""The search space of a DeepSpeed workload, in the knobs of DeepSpeed's own loss scaler.

DeepSpeed's ``fp16`` block sets its scaler with ``initial_scale_power`` (the initial scale
is ``2**initial_scale_power``), ``loss_scale_window``, ``hysteresis``, ``min_loss_scale`` and
``consecutive_hysteresis``; it grows by 2 and backs off by 0.5 always, and casts the whole
model, so no module stays in float32. A space file is read for a DeepSpeed workload as:

- ``init_scale``'s range as ``initial_scale_power``'s, in whole powers of two from
  ``2**0`` (a scale below DeepSpeed's ``min_loss_scale`` of at least 1 means nothing);
- ``growth_interval``'s as ``loss_scale_window``'s;
- ``hysteresis``, ``min_loss_scale`` and ``consecutive_hysteresis`` as the file gives them
  (these keys mean something to a DeepSpeed workload only), else :data:`DEFAULTS`;
- ``clip_norm`` as it is (DeepSpeed's ``gradient_clipping``), ``dtype`` as it is where the
  device runs bfloat16; ``growth_factor`` and ``backoff_factor`` left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import optuna

from scalertune._amp._config import AmpConfig, DeepSpeedFp16Config
from scalertune._errors import UsageError

#: The marker a DeepSpeed space carries among its parameters (stored with the study).
ENGINE_KEY, ENGINE = "loss_scaler", "deepspeed"

#: The knobs only a DeepSpeed workload's space searches.
KNOBS = ("initial_scale_power", "loss_scale_window", "hysteresis", "min_loss_scale")

#: The keys a space file may hold for a DeepSpeed workload, beside the common ones.
SPACE_KEYS = (ENGINE_KEY, *KNOBS, "consecutive_hysteresis")

#: Where a space file does not say: hysteresis 1 (each overflow backs off, as GradScaler) to 4
#: (DeepSpeed's default is 2); a floor from DeepSpeed's 1 to 2**10 (a higher floor keeps
#: small gradients from flushing, and an overflow at it ends the training); the hysteresis
#: refilled after every clean step or only at a growth.
DEFAULTS: dict[str, Any] = {
    "hysteresis": {"low": 1, "high": 4},
    "min_loss_scale": {"low": 1, "high": 1024, "log": True},
    "consecutive_hysteresis": {"choices": [False, True]},
}


def is_deepspeed(params: Mapping[str, Any]) -> bool:
    return params.get(ENGINE_KEY) == ENGINE


def deepspeed_params(name: str, params: Mapping[str, Any], *, bfloat16: bool) -> dict[str, Any]:
    """A space's ``params`` in DeepSpeed's knobs (see the module's docstring); bfloat16 left
    out where the device cannot run it."""
    if params.get("fp32_modules"):
        raise UsageError(
            f"search space {name!r} keeps modules in float32 (fp32_modules), which DeepSpeed's "
            "fp16 mode cannot (it casts the whole model): drop fp32_modules"
        )
    out: dict[str, Any] = {ENGINE_KEY: ENGINE}
    dtype = params.get("dtype", {"choices": ["float16"]})
    choices = list(dtype["choices"]) if isinstance(dtype, Mapping) else [dtype]
    if not bfloat16:
        choices = [c for c in choices if c != "bfloat16"] or ["float16"]
    out["dtype"] = {"choices": choices}
    if "init_scale" in params:
        out["initial_scale_power"] = _powers(name, params["init_scale"])
    if "growth_interval" in params:
        out["loss_scale_window"] = params["growth_interval"]
    for key in ("initial_scale_power", "loss_scale_window"):  # DeepSpeed's own words win
        if key in params:
            out[key] = params[key]
    for key, spec in DEFAULTS.items():
        out[key] = params.get(key, spec)
    if "clip_norm" in params:
        out["clip_norm"] = params["clip_norm"]
    check(name, out)
    return out


def _powers(name: str, spec: Any) -> Any:
    """``init_scale``'s range as whole powers of two from 0."""
    if not isinstance(spec, Mapping):
        power = math.log2(spec) if spec > 0 else -1
        if power != round(power) or power < 0:
            raise UsageError(
                f"search space {name!r}: init_scale {spec!r} is no whole power of two >= 1, "
                "which DeepSpeed's initial_scale_power needs"
            )
        return round(power)
    low = max(0, math.ceil(math.log2(spec["low"])))
    high = max(low, math.floor(math.log2(spec["high"])))
    return {"low": low, "high": high}


def check(name: str, params: Mapping[str, Any]) -> None:
    """Each DeepSpeed knob of a space: an integer range or value, as DeepSpeed takes it."""
    for key in (*KNOBS, "consecutive_hysteresis"):
        if key not in params:
            continue
        spec = params[key]
        if key == "consecutive_hysteresis":
            values = spec["choices"] if isinstance(spec, Mapping) else [spec]
            if not values or not all(isinstance(v, bool) for v in values):
                raise UsageError(
                    f"search space {name!r}: consecutive_hysteresis takes true, false or "
                    "choices of them"
                )
            continue
        values = [spec["low"], spec["high"]] if isinstance(spec, Mapping) else [spec]
        least = 0 if key == "initial_scale_power" else 1
        if not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= least for v in values
        ) or (isinstance(spec, Mapping) and spec["low"] > spec["high"]):
            raise UsageError(
                f"search space {name!r}: {key} takes an integer >= {least}, or a range "
                f"{{low, high}} of them, got {spec!r}"
            )


def suggest(params: Mapping[str, Any], trial: optuna.Trial, values: dict[str, Any]) -> AmpConfig:
    """The config a trial's parameters name in a DeepSpeed space (``values`` holds its
    ``dtype`` and its ``clip_norm``, if any)."""
    if values["dtype"] != "float16":
        return AmpConfig(**values)
    knobs: dict[str, Any] = {}
    for key in KNOBS:
        spec = params.get(key)
        if spec is None:
            continue
        if not isinstance(spec, Mapping):
            knobs[key] = spec
            continue
        log = bool(spec.get("log")) or key == "loss_scale_window" and spec["high"] > 4 * spec["low"]
        knobs[key] = trial.suggest_int(key, int(spec["low"]), int(spec["high"]), log=log)
    spec = params.get("consecutive_hysteresis", False)
    consecutive = (
        trial.suggest_categorical("consecutive_hysteresis", list(spec["choices"]))
        if isinstance(spec, Mapping)
        else spec
    )
    return DeepSpeedFp16Config.from_fp16_block(
        {"enabled": True, **knobs, "consecutive_hysteresis": consecutive},
        clip_norm=values.get("clip_norm"),
    )


def params_for(params: Mapping[str, Any], config: AmpConfig) -> dict[str, Any] | None:
    """The DeepSpeed knobs :func:`suggest` would record to make ``config`` (its dtype and
    clipping aside), or ``None`` when the space cannot make it."""
    if config.dtype != "float16":
        return {}
    if not isinstance(config, DeepSpeedFp16Config):
        return None
    block = config.fp16_block()
    out: dict[str, Any] = {}
    for key in (*KNOBS, "consecutive_hysteresis"):
        spec, value = params.get(key), block[key]
        if spec is None:
            if value != DeepSpeedFp16Config().fp16_block()[key]:
                return None
            continue
        if not isinstance(spec, Mapping):
            if value != spec:
                return None
            continue
        inside = (
            value in spec["choices"] if "choices" in spec else spec["low"] <= value <= spec["high"]
        )
        if not inside:
            return None
        out[key] = value
    return out


def distinct(params: Mapping[str, Any]) -> int | None:
    """How many float16 configs a DeepSpeed space can make apart from clipping; ``None``
    when a range makes it endless."""
    count = 1
    for key in (*KNOBS, "consecutive_hysteresis"):
        spec = params.get(key)
        if not isinstance(spec, Mapping):
            continue
        if "choices" in spec:
            count *= len(set(spec["choices"]))
        elif spec["low"] != spec["high"]:
            return None
    return count
