"""A Hugging Face ``Trainer`` (TRL's trainers are subclasses) under a runtime's config.

``TrainingArguments`` has no loss-scaler settings, and the Trainer builds its Accelerator
from ``fp16``/``bf16`` with Accelerate's defaults; on a CPU ``fp16=True`` trains in float32.
The Trainer runs everything through that Accelerator, though: its ``training_step`` calls
``accelerator.backward``, its clipping ``accelerator.clip_grad_norm_``, its optimizer step
the optimizer ``accelerator.prepare`` wrapped (and it steps the LR scheduler only when
``accelerator.optimizer_step_was_skipped`` is false). :func:`route_trainer` routes that
Accelerator (``_accelerate``) and the model's forward, so the Trainer trains under the
runtime: its dtype, its GradScaler, its float32 islands, and its clipping as the Trainer's own
``max_grad_norm``.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

import torch

from scalertune._amp._runtime import AmpRuntime
from scalertune._errors import UsageError
from scalertune._frameworks import _transformers_private
from scalertune._frameworks._accelerate import check_accelerator, route_accelerator
from scalertune._frameworks._accelerate_private import set_sync_gradients
from scalertune._frameworks._route import Route
from scalertune._frameworks._state_file import load_state, save_state


def check_trainer(trainer: Any, *, before: str = "attach before trainer.train()") -> None:
    """Refuse, in one line, a Trainer the runtime cannot drive (``before``: when to hand it
    over)."""
    if getattr(trainer, "is_fsdp_enabled", False):
        raise UsageError(
            "this Trainer runs FSDP: scalertune drives single-process and DDP Trainers only"
        )
    halves = {
        p.dtype
        for p in trainer.model.parameters()
        if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16)
    }
    if halves:
        raise UsageError(
            f"the Trainer's model has {', '.join(sorted(map(str, halves)))} "
            "parameters: mixed precision keeps float32 weights; load the model in "
            "float32 (torch_dtype=torch.float32)"
        )
    check_accelerator(trainer.accelerator, what="this Trainer", before=before)


def route_trainer(trainer: Any, route: Route, *, training: bool) -> None:
    """Train ``trainer`` under ``route``'s runtime (see the module's docstring); with
    ``training`` (``scalertune.attach``) its clipping becomes the config's."""
    route_accelerator(trainer.accelerator, route, training=training)
    route.wrap_forward(trainer.model)
    if training:
        amp = route.runtime()
        amp.prepare(trainer.model)
        # 0 is the Trainer's own "no clipping"
        trainer.args.max_grad_norm = amp.config.clip_norm or 0.0
        if amp.check is not None:
            _check_compute_loss(trainer, amp)
        _keep_state(trainer, amp)


def _keep_state(trainer: Any, amp: AmpRuntime) -> None:
    """Every checkpoint the Trainer saves keeps the runtime's state (``scalertune_amp.pt``, written
    by the rank that saves, after the Trainer's own files), and ``train(resume_from_checkpoint=
    ...)`` restores it before the Trainer resumes: a layer the check kept out of float8, a
    dtype it left, stay so, and its record goes on (the Trainer keeps callbacks' state only as
    JSON, and the runtime's is not)."""
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class _SaveRuntime(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
            if args.should_save and os.path.isdir(folder):
                save_state(amp, folder)

    # first: a user's on_save that copies the checkpoint away sees it whole
    _transformers_private.add_first(trainer, _SaveRuntime())
    original = trainer.train

    @functools.wraps(original)
    def train(resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        folder = resume_from_checkpoint
        if folder is True:  # the Trainer's own rule: the last checkpoint in output_dir
            from transformers.trainer_utils import get_last_checkpoint

            folder = get_last_checkpoint(trainer.args.output_dir)
        if isinstance(folder, (str, os.PathLike)):
            load_state(amp, os.fspath(folder), stacklevel=2)
        return original(resume_from_checkpoint, *args, **kwargs)

    trainer.train = train


def _check_compute_loss(trainer: Any, amp: AmpRuntime) -> None:
    """The Trainer's ``compute_loss`` (its own, or a subclass's) through the runtime's
    :meth:`~scalertune.AmpRuntime.loss`, so that the run checks itself: the model's forward
    is routed under autocast already, and the check's float32 pass runs the same call."""
    original = trainer.compute_loss

    @functools.wraps(original)
    def compute_loss(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        return amp.loss(lambda: original(model, inputs, *args, **kwargs), autocast=False)

    trainer.compute_loss = compute_loss


def trainer_device(trainer: Any) -> torch.device:
    """The device the Trainer trains on (``TrainingArguments.device``)."""
    return torch.device(trainer.args.device)


def ranks_model(trainer: Any) -> torch.nn.Module:
    """The model a Trainer trains: under a process group of several ranks, wrapped by its
    Accelerator as ``train()`` wraps it (DDP for MULTI_CPU and MULTI_GPU); else its own."""
    accelerator = trainer.accelerator
    if accelerator.num_processes > 1:
        return accelerator.prepare_model(trainer.model)
    return trainer.model


def micro_batch(trainer: Any, model: torch.nn.Module, last: bool) -> Any:
    """The context of one micro-batch of a step, as ``Trainer._run_epoch`` sets it: the
    Accelerator told whether gradients sync after it, and a wrapped model's all-reduce held
    back (``no_sync``) on all but the last."""
    accelerator = trainer.accelerator
    set_sync_gradients(accelerator, last)  # what train() sets
    if last or model is trainer.model:
        return contextlib.nullcontext()
    return accelerator.no_sync(model)
