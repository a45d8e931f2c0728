"""The DeepSpeed export: its config's ``fp16``, ``bf16`` and ``gradient_clipping`` from the
config (its own searched block as it trained), what DeepSpeed's dynamic loss scaler cannot
express of GradScaler's knobs, and the searched factory's own DeepSpeed config around it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from scalertune._amp._config import FP16_OTHER_KEYS, AmpConfig, DeepSpeedFp16Config
from scalertune._export._code import Parts
from scalertune._replay._deepspeed_block import DEEPSPEED_MIN_LOSS_SCALE, deepspeed_fp16_block


def horizon(evidence: Any, config: AmpConfig) -> list[str]:
    """What DeepSpeed's scaler would do over the search's horizon, replayed from the float32
    reference's gradient trace (the search writes it for a float16 config: for a block it
    searched in DeepSpeed, its own prediction)."""
    key = "prediction" if isinstance(config, DeepSpeedFp16Config) else "deepspeed_prediction"
    said = evidence.get(key) if isinstance(evidence, Mapping) else None
    if not isinstance(said, Mapping) or "says" not in said:
        return []
    return [
        f"over the horizon ({said.get('horizon')} steps), replayed from the search's "
        f"float32 gradient trace, DeepSpeed's scaler {said['says']}"
    ]


def users_config(parts: Parts, evidence: Any) -> None:
    """The DeepSpeed config the searched factory (or Trainer) trained with, under the
    answer's ``fp16``, ``bf16`` and ``gradient_clipping``: the whole ``ds_config.json``."""
    facts = evidence.get("deepspeed") if isinstance(evidence, Mapping) else None
    base = facts.get("config") if isinstance(facts, Mapping) else None
    if not isinstance(base, Mapping):
        return
    kept = {k: v for k, v in base.items() if k not in ("fp16", "bf16", "bfloat16")}
    parts.spec = {**kept, **parts.spec}
    searched, answer = base.get("fp16"), parts.spec.get("fp16")
    if isinstance(searched, Mapping) and isinstance(answer, dict) and answer.get("enabled"):
        # what the block held beside its scaler (auto_cast casts the inputs) trains as searched
        others = {k: searched[k] for k in FP16_OTHER_KEYS if k in searched}
        parts.spec["fp16"] = {**answer, **others}
    parts.usage = [
        line for line in parts.usage if "refuses a config without a batch size" not in line
    ]
    parts.usage.insert(
        0,
        "# the searched DeepSpeed config, with the answer's fp16, bf16 and gradient_clipping",
    )


def lowest_scale(evidence: Any) -> float | None:
    """The smallest loss scale the recommended config reached on any seed of the search."""
    if not isinstance(evidence, Mapping):
        return None
    runs = [evidence, *(evidence.get("confirmation") or {}).values()]
    scales = [
        r["min_scale"]
        for r in runs
        if isinstance(r, Mapping) and isinstance(r.get("min_scale"), (int, float))
    ]
    return min(scales) if scales else None


def deepspeed(c: AmpConfig, lowest: float | None, batch: int | None) -> Parts:
    spec: dict[str, Any] = {}
    if batch is not None:
        spec["train_micro_batch_size_per_gpu"] = batch
    parts = Parts(spec, uses_device=False)
    if isinstance(c, DeepSpeedFp16Config):  # searched in DeepSpeed: its block as it trained
        spec["fp16"] = c.fp16_block()
    else:
        spec["fp16"] = fp16_block(c, lowest, parts) if c.uses_scaler else {"enabled": False}
    spec["bf16"] = {"enabled": c.dtype == "bfloat16"}
    # Always written: DeepSpeed clips at 1.0 when the key is absent; 0 turns clipping off.
    spec["gradient_clipping"] = c.clip_norm if c.clip_norm is not None else 0.0
    if c.fp32_modules:
        parts.lost.append(
            f"fp32_modules {list(c.fp32_modules)}: DeepSpeed's fp16 and bf16 modes "
            "cast the whole model to half precision; keep those modules' "
            "computation in float32 in your model code"
        )
    if c.dtype != "float32" and not isinstance(c, DeepSpeedFp16Config):
        parts.differ.append(
            f"DeepSpeed casts the model's weights and activations to {c.dtype} "
            "instead of autocasting: ops autocast runs in float32 (softmax, "
            "layer_norm, losses) run in half precision unless the model upcasts"
        )
    parts.usage = [
        "# save it as ds_config.json: deepspeed.initialize(model=model, "
        'model_parameters=model.parameters(), config="ds_config.json")'
    ]
    if batch is None:
        parts.usage.append(
            "# DeepSpeed refuses a config without a batch size: add your "
            "train_micro_batch_size_per_gpu (or export with --micro-batch-size)"
        )
    return parts


def fp16_block(c: AmpConfig, lowest: float | None, parts: Parts) -> dict[str, Any]:
    """DeepSpeed's dynamic loss scaler, as close to GradScaler with ``c``'s knobs as it gets.

    DeepSpeed (``deepspeed/runtime/fp16/loss_scaler.py`` and ``fused_optimizer.py``) starts at
    ``2**initial_scale_power``, halves the scale on an overflow (after ``hysteresis``
    overflows; 1 backs off on every one, as GradScaler does) but never below
    ``min_loss_scale``, and doubles it when ``(step - last_overflow_step - 1)`` is a positive
    multiple of ``loss_scale_window``: after ``window + 1`` clean steps, then every ``window``.
    Under ZeRO an overflow *at* ``min_loss_scale`` raises and ends training.
    """
    power = math.log2(c.init_scale)
    nearest = max(round(power), 0)
    if c.init_scale < DEEPSPEED_MIN_LOSS_SCALE:
        parts.lost.append(
            f"init_scale={c.init_scale!r}: DeepSpeed's scale never goes below "
            f"min_loss_scale={DEEPSPEED_MIN_LOSS_SCALE} (the smallest its config "
            "takes); nearest: initial_scale_power 0 = 1.0"
        )
    elif power != round(power):
        parts.lost.append(
            f"init_scale={c.init_scale!r} is not a power of two; nearest: "
            f"initial_scale_power {nearest} = {2.0**nearest!r}"
        )
    if c.growth_factor != 2.0:
        parts.lost.append(f"growth_factor={c.growth_factor!r}: DeepSpeed always grows by 2")
    if c.backoff_factor != 0.5:
        parts.lost.append(f"backoff_factor={c.backoff_factor!r}: DeepSpeed always backs off by 0.5")
    if lowest is not None and lowest < DEEPSPEED_MIN_LOSS_SCALE <= c.init_scale:
        parts.lost.append(
            f"the search's runs of this config backed the scale off to {lowest:.3g}; "
            f"DeepSpeed stops at {DEEPSPEED_MIN_LOSS_SCALE}, and under ZeRO an "
            "overflow there ends training"
        )
    window = c.growth_interval
    parts.differ.append(
        f"growth: DeepSpeed doubles the scale after loss_scale_window+1 = {window + 1} clean "
        f"steps (after an overflow or the start), then every {window}: each growth comes 1 step "
        f"later than GradScaler's ({window}, {2 * window}, ...)"
    )
    floor = (
        f"; in the search this config's scale stayed at or above {lowest:.3g}"
        if lowest is not None and lowest >= DEEPSPEED_MIN_LOSS_SCALE
        else ""
    )
    parts.differ.append(
        f"minimum: DeepSpeed never lowers the scale below min_loss_scale="
        f"{DEEPSPEED_MIN_LOSS_SCALE}, and under ZeRO (stages 1-3) an overflow at that minimum "
        f"raises and ends training: from 2**{nearest} that is {nearest + 1} overflow"
        f"{'s' if nearest else ''} in a row without a growth between (without ZeRO it skips the "
        "step and stays at 1). GradScaler "
        f"keeps multiplying the scale by backoff_factor{floor}"
    )
    return deepspeed_fp16_block(c)
