"""The Lightning export: ``MixedPrecision`` with the config's GradScaler and the Trainer's
clipping (a float8 config: torchao's conversion, and the precision around it)."""

from __future__ import annotations

from typing import Any

from scalertune._amp._config import AmpConfig
from scalertune._export import _torch, _torchao
from scalertune._export._code import Call, Device, Parts


def lightning(c: AmpConfig, device: Device) -> Parts:
    plugin = "lightning.pytorch.plugins.precision:MixedPrecision"
    spec: dict[str, Any]
    if c.dtype == "float16":
        spec = {
            "plugins": [
                Call(plugin, ("16-mixed", device), {"scaler": _torch.grad_scaler(c, device)})
            ]
        }
    elif c.dtype == "bfloat16":
        spec = {"plugins": [Call(plugin, ("bf16-mixed", device))]}
    else:
        spec = {"precision": "32-true"}
    # None is Lightning's own "no clipping"; written out so that it is not left to a default.
    spec["gradient_clip_val"] = c.clip_norm
    spec["gradient_clip_algorithm"] = "norm"
    usage = ["# trainer = lightning.pytorch.Trainer(**trainer_kwargs, ...your own arguments)"]
    if c.dtype != "float32":
        usage.append(
            "# (the plugin's device is the Trainer's accelerator: one kind of device for both;"
        )
        usage.append("# no precision= beside it: Lightning refuses both)")
    return Parts(spec, name="trainer_kwargs", usage=usage, uses_device=c.dtype != "float32")


def lightning_float8(c: AmpConfig, device: Device) -> Parts:
    parts = lightning(_torchao.around(c), device)
    _torchao.converted_before(parts, c, device, "before trainer.fit(...)")
    return parts
