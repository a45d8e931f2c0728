"""The torch export: a GradScaler of the config's knobs, autocast's arguments and the
clipping, and a float8 config as torchao's conversion with them."""

from __future__ import annotations

from typing import Any

from scalertune._amp._config import AmpConfig
from scalertune._export import _torchao
from scalertune._export._code import Call, Device, Name, Parts


def knobs(c: AmpConfig) -> dict[str, Any]:
    return {
        "init_scale": c.init_scale,
        "growth_factor": c.growth_factor,
        "backoff_factor": c.backoff_factor,
        "growth_interval": c.growth_interval,
    }


def grad_scaler(c: AmpConfig, device: Device) -> Call:
    if not c.uses_scaler:
        return Call("torch.amp:GradScaler", (device,), {"enabled": False})
    return Call("torch.amp:GradScaler", (device,), knobs(c))


def loop(c: AmpConfig, device: Device) -> Parts:
    autocast: dict[str, Any] = {"device_type": device}
    if c.dtype == "float32":
        autocast["enabled"] = False
    else:
        autocast["dtype"] = Name(f"torch:{c.dtype}")
    usage = [
        "",
        "# for inputs, targets in loader:",
        "#     optimizer.zero_grad(set_to_none=True)",
        "#     with torch.autocast(**autocast):",
        "#         loss = loss_fn(model(inputs), targets)",
        "#     scaler.scale(loss).backward()",
    ]
    if c.clip_norm is not None:
        usage += [
            "#     scaler.unscale_(optimizer)  # clip the true gradients, not scaled ones",
            "#     torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
        ]
    usage += [
        "#     scaler.step(optimizer)  # skipped when the gradients are inf/NaN",
        "#     scaler.update()",
        "# scalertune.load(YAML) does the same step and adds the guard the search recommends",
    ]
    return Parts(
        {"scaler": grad_scaler(c, device), "autocast": autocast, "max_norm": c.clip_norm},
        usage=usage,
    )


def torch_float8(c: AmpConfig, device: Device) -> Parts:
    return _torchao.torchao(c, device, clip=True)
