"""The Accelerate export: ``mixed_precision`` and ``GradScalerKwargs``; clipping is a call in
the loop. Also the note, which a Hugging Face Trainer shares, that Accelerate trains float16
in float32 on a CPU."""

from __future__ import annotations

from typing import Any

from scalertune._amp._config import AmpConfig
from scalertune._export import _torch
from scalertune._export._code import Call, Device, Parts


def accelerate(c: AmpConfig, device: Device) -> Parts:
    spec: dict[str, Any] = {
        "mixed_precision": {"float16": "fp16", "bfloat16": "bf16", "float32": "no"}[c.dtype]
    }
    if c.uses_scaler:
        spec["kwargs_handlers"] = [Call("accelerate.utils:GradScalerKwargs", (), _torch.knobs(c))]
    if device.value == "cpu" and not device.auto:
        spec["cpu"] = True  # Accelerate would take the GPU if there is one
    parts = Parts(spec, name="accelerator_kwargs", uses_device=bool(c.fp32_modules))
    parts.usage = ["# accelerator = accelerate.Accelerator(**accelerator_kwargs)"]
    if c.clip_norm is not None:
        parts.usage += [
            "# in the loop, between accelerator.backward(loss) and optimizer.step():",
            f"#     accelerator.clip_grad_norm_(model.parameters(), {c.clip_norm!r})",
        ]
    parts.differ += float32_on_a_cpu(c, device, "mixed_precision='fp16'")
    return parts


def float32_on_a_cpu(c: AmpConfig, device: Device, setting: str) -> list[str]:
    """The one note that Accelerate's float16 (an Accelerator's, a Hugging Face Trainer's)
    trains in float32 on a CPU, where ``attach`` trains float16; none elsewhere."""
    if not (c.uses_scaler and device.value == "cpu"):
        return []
    return [
        f"Accelerate makes a GradScaler and autocasts to float16 only on GPUs: on a CPU, "
        f"{setting} trains in float32 (scalertune.attach trains float16 there too)"
    ]
