"""The Transformers export: ``TrainingArguments``' ``fp16``/``bf16``/``max_grad_norm`` (a
float8 config: torchao's conversion before the Trainer, and the precision around it)."""

from __future__ import annotations

from scalertune._amp._config import AmpConfig
from scalertune._export import _accelerate, _torchao
from scalertune._export._code import Device, Expr, Parts


def transformers(c: AmpConfig, device: Device) -> Parts:
    parts = Parts(
        {
            "fp16": c.dtype == "float16",
            "bf16": c.dtype == "bfloat16",
            # 0 turns off the Trainer's own clipping at 1.0
            "max_grad_norm": c.clip_norm if c.clip_norm is not None else 0.0,
            "use_cpu": Expr('device == "cpu"', device.value == "cpu"),
        },
        name="training_arguments",
    )
    parts.differ += _accelerate.float32_on_a_cpu(c, device, "the Trainer's fp16=True")
    parts.usage = [
        "# args = transformers.TrainingArguments(output_dir=..., **training_arguments)",
        "# trainer = transformers.Trainer(model=model, args=args, ...)",
    ]
    return parts


def transformers_float8(c: AmpConfig, device: Device) -> Parts:
    parts = transformers(_torchao.around(c), device)
    _torchao.converted_before(parts, c, device, "before transformers.Trainer(model=model, ...)")
    return parts
