"""export: the recommended config as paste-ready code for the framework the user trains with.

Frameworks expose different subsets of the knobs. Where one cannot express a value, the output
says so in a comment and uses the nearest setting it has; ``strict=True`` makes that an error.

- torch: everything (GradScaler, autocast, clip_grad_norm_, or scalertune.load itself).
- lightning: ``MixedPrecision(..., scaler=GradScaler(...))`` and ``gradient_clip_val``.
- accelerate: ``mixed_precision`` and ``GradScalerKwargs``; clipping is a call in the loop.
- transformers: ``TrainingArguments`` has only ``fp16``/``bf16``/``max_grad_norm``.
- deepspeed: its ``fp16`` block fixes growth at 2 and backoff at 0.5, and takes the initial
  scale as a power of two.

Float32 islands are applied by ``scalertune.load(...).prepare(model)`` in every framework
that runs the model under autocast (all but DeepSpeed, whose fp16 mode casts the model).
"""

from __future__ import annotations

import math
from typing import Callable

from scalertune._config import PYTORCH_DEFAULT, AmpConfig
from scalertune._errors import UsageError

FRAMEWORKS = ("torch", "lightning", "accelerate", "transformers", "deepspeed")


class Export:
    """Lines of code plus what the framework could not express."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.lost: list[str] = []

    def add(self, line: str = "") -> None:
        self.lines.append(line)

    def cannot(self, what: str) -> None:
        self.lost.append(what)
        self.lines.append(f"# NOT EXPRESSIBLE: {what}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def export(config: AmpConfig, framework: str, *, yaml_path: str = "amp.yaml",
           strict: bool = False) -> str:
    """Code or config for ``framework`` that trains with ``config``."""
    if framework not in FRAMEWORKS:
        raise UsageError(f"unknown framework {framework!r}: use one of {', '.join(FRAMEWORKS)}")
    out = Export()
    _WRITERS[framework](config, out, yaml_path)
    if strict and out.lost:
        raise UsageError(f"{framework} cannot express: {'; '.join(out.lost)} "
                         "(drop --strict to get the nearest setting)")
    return out.text()


def _scaler_args(c: AmpConfig) -> str:
    return (f"init_scale={c.init_scale!r}, growth_factor={c.growth_factor!r}, "
            f"backoff_factor={c.backoff_factor!r}, growth_interval={c.growth_interval!r}")


def _islands(c: AmpConfig, out: Export, yaml_path: str) -> None:
    if c.fp32_modules:
        out.add(f"# float32 islands ({', '.join(c.fp32_modules)}): apply them to the model "
                "before training")
        out.add("import scalertune")
        out.add(f"scalertune.load({yaml_path!r}, device=device).prepare(model)")


def _torch(c: AmpConfig, out: Export, yaml_path: str) -> None:
    out.add('device = "cuda"')
    out.add("import torch")
    if c.dtype == "float32":
        out.add("# float32: no autocast, no scaler")
    else:
        out.add(f"scaler = torch.amp.GradScaler(device, {_scaler_args(c)}, "
                f"enabled={c.uses_scaler})")
    _islands(c, out, yaml_path)
    out.add("")
    out.add("# for inputs, targets in loader:")
    out.add("#     optimizer.zero_grad(set_to_none=True)")
    if c.dtype != "float32":
        out.add(f"#     with torch.autocast(device, dtype=torch.{c.dtype}):")
        out.add("#         loss = loss_fn(model(inputs), targets)")
        out.add("#     scaler.scale(loss).backward()")
        out.add("#     scaler.unscale_(optimizer)  # clip the true gradients, not scaled ones")
    else:
        out.add("#     loss = loss_fn(model(inputs), targets)")
        out.add("#     loss.backward()")
    if c.clip_norm is not None:
        out.add(f"#     torch.nn.utils.clip_grad_norm_(model.parameters(), {c.clip_norm!r})")
    if c.dtype != "float32":
        out.add("#     scaler.step(optimizer)")
        out.add("#     scaler.update()")
    else:
        out.add("#     optimizer.step()")
    out.add("# or, the same in three calls: amp = scalertune.load"
            f"({yaml_path!r}); amp.train_step(model, optimizer, loss_fn, batch)")


def _lightning(c: AmpConfig, out: Export, yaml_path: str) -> None:
    out.add('device = "cuda"')
    out.add("import torch")
    out.add("from lightning.pytorch import Trainer")
    clip = (f", gradient_clip_val={c.clip_norm!r}, gradient_clip_algorithm=\"norm\""
            if c.clip_norm is not None else "")
    if c.dtype == "float16":
        out.add("from lightning.pytorch.plugins.precision import MixedPrecision")
        out.add(f"scaler = torch.amp.GradScaler(device, {_scaler_args(c)})")
        out.add("trainer_kwargs = dict(plugins=[MixedPrecision(\"16-mixed\", device, "
                f"scaler=scaler)]{clip})")
    elif c.dtype == "bfloat16":
        out.add(f"trainer_kwargs = dict(precision=\"bf16-mixed\"{clip})")
    else:
        out.add(f"trainer_kwargs = dict(precision=\"32-true\"{clip})")
    _islands(c, out, yaml_path)
    out.add("trainer = Trainer(**trainer_kwargs)  # plus your own Trainer arguments")


def _accelerate(c: AmpConfig, out: Export, yaml_path: str) -> None:
    out.add('device = "cuda"')
    out.add("from accelerate import Accelerator")
    mixed = {"float16": "fp16", "bfloat16": "bf16", "float32": "no"}[c.dtype]
    if c.dtype == "float16":
        out.add("from accelerate.utils import GradScalerKwargs")
        out.add(f"accelerator = Accelerator(mixed_precision=\"fp16\", kwargs_handlers="
                f"[GradScalerKwargs({_scaler_args(c)})])")
        out.add("# Accelerate makes its GradScaler only on GPUs; on a CPU it trains in float32.")
    else:
        out.add(f"accelerator = Accelerator(mixed_precision=\"{mixed}\")")
    _islands(c, out, yaml_path)
    if c.clip_norm is not None:
        out.add("# in the loop, between accelerator.backward(loss) and optimizer.step():")
        out.add(f"#     accelerator.clip_grad_norm_(model.parameters(), {c.clip_norm!r})")


def _transformers(c: AmpConfig, out: Export, yaml_path: str) -> None:
    out.add("from transformers import TrainingArguments")
    if c.uses_scaler:
        for knob in ("init_scale", "growth_factor", "backoff_factor", "growth_interval"):
            if getattr(c, knob) != getattr(PYTORCH_DEFAULT, knob):
                out.cannot(f"{knob}={getattr(c, knob)!r}: TrainingArguments has no loss-scaler "
                           f"settings; the Trainer uses PyTorch's default "
                           f"({getattr(PYTORCH_DEFAULT, knob)!r})")
    if c.fp32_modules:
        out.add("# float32 islands: call scalertune.load(...).prepare(model) before Trainer(...)")
    clip = c.clip_norm if c.clip_norm is not None else 0.0
    note = ("" if c.clip_norm is not None
            else "  # 0 turns off the Trainer's default clipping at 1.0")
    out.add(f"args = TrainingArguments(output_dir=\"out\", fp16={c.dtype == 'float16'}, "
            f"bf16={c.dtype == 'bfloat16'}, max_grad_norm={clip!r}){note}")


def _deepspeed(c: AmpConfig, out: Export, yaml_path: str) -> None:
    block: list[str] = []
    if c.dtype == "float16":
        power = math.log2(c.init_scale)
        nearest = round(power)
        if power != nearest:
            out.cannot(f"init_scale={c.init_scale!r} is not a power of two; nearest: "
                       f"2**{nearest} = {2.0 ** nearest!r}")
        if c.growth_factor != 2.0:
            out.cannot(f"growth_factor={c.growth_factor!r}: DeepSpeed always grows by 2")
        if c.backoff_factor != 0.5:
            out.cannot(f"backoff_factor={c.backoff_factor!r}: DeepSpeed always backs off by 0.5")
        block = ['    "fp16": {', '        "enabled": True,',
                 '        "loss_scale": 0,  # dynamic',
                 f'        "initial_scale_power": {nearest},',
                 f'        "loss_scale_window": {c.growth_interval},',
                 '        "hysteresis": 1,  # back off on every overflow, as GradScaler does',
                 f'        "min_loss_scale": {min(1.0, 2.0 ** nearest)!r},', '    },']
    elif c.dtype == "bfloat16":
        block = ['    "bf16": {"enabled": True},']
    if c.fp32_modules:
        out.cannot(f"fp32_modules {list(c.fp32_modules)}: DeepSpeed's fp16 mode casts the whole "
                   "model to half; keep those modules' computation in float32 in your code")
    out.add("ds_config = {")
    for line in block:
        out.add(line)
    if c.clip_norm is not None:
        out.add(f'    "gradient_clipping": {c.clip_norm!r},')
    out.add("}")
    out.add("# engine, optimizer, _, _ = deepspeed.initialize(model=model, "
            "model_parameters=model.parameters(), config=ds_config)")


_WRITERS: dict[str, Callable[[AmpConfig, Export, str], None]] = {
    "torch": _torch, "lightning": _lightning, "accelerate": _accelerate,
    "transformers": _transformers, "deepspeed": _deepspeed,
}
