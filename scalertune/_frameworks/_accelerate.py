"""An Accelerate ``Accelerator`` that trains under a runtime's config.

Accelerate decides mixed precision when the ``Accelerator`` is made: ``mixed_precision="fp16"``
builds a GradScaler with PyTorch's defaults (or ``GradScalerKwargs``), and only off the CPU;
on a CPU it trains in float32 without a word. :func:`route_accelerator` leaves that decision
aside and puts the runtime in its place, on the objects Accelerate itself calls:

- ``prepare_model``: the model's forward runs under the runtime's autocast (float32 outputs,
  as Accelerate's own), with the config's float32 islands; Accelerate's autocast is off;
- ``backward``: the runtime's backward (the scaled loss), after Accelerate's division by its
  gradient accumulation steps;
- Accelerate's own float8 (``mixed_precision="fp8"``): its handlers are set aside, so
  ``prepare`` converts no Linear layer itself; a float8 config converts them in the runtime's
  way (its recipe, the float32 pass of the in-run check, its islands), and any other config
  trains none in float8;
- in training, ``scaler`` is the runtime's GradScaler, so the optimizers ``prepare`` wraps
  step and update through it, and ``unscale_gradients`` (``clip_grad_norm_``) unscales with
  it. Each prepared optimizer's ``step_was_skipped`` is the runtime's verdict, so the
  schedulers ``prepare`` wraps (and a Hugging Face Trainer's) stay put on a skipped step.
  Accelerate's own verdict is whether the optimizer's ``step`` was called, which a fused
  optimizer's always is: it applies GradScaler's flag inside its kernel.

Each is an attribute of this ``Accelerator`` only; nothing of Accelerate's own changes. What
is replaced, and the private names read, are listed in ``_accelerate_private``.
"""

from __future__ import annotations

import functools
import os
import types
from typing import Any

from scalertune._amp._runtime import AmpRuntime
from scalertune._errors import UsageError
from scalertune._frameworks import _accelerate_private
from scalertune._frameworks._deepspeed import refuse_deepspeed
from scalertune._frameworks._route import ROUTE_ATTR, Route
from scalertune._frameworks._state_file import load_state, save_state

#: Accelerate's distributed types that run the model under autocast with a GradScaler, one
#: model copy per process: the runtime can take their place.
_SUPPORTED = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_HPU")


def check_accelerator(
    accelerator: Any,
    *,
    what: str = "this Accelerator",
    before: str = "attach before accelerator.prepare(...)",
) -> None:
    """Refuse, in one line, what the runtime cannot drive (``before``: when to hand it over)."""
    kind = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type))
    if kind == "DEEPSPEED":
        refuse_deepspeed(what, "trainer")
    if kind not in _SUPPORTED:
        raise UsageError(
            f"{what} runs {kind}: scalertune drives single-process and DDP "
            "training (one model copy per process) only"
        )
    variable = _accelerate_private.FP8_BACKEND_VARIABLE
    if _accelerate_private.fp8_backend(None) != "NO":
        raise UsageError(
            f"{variable}={os.environ[variable]} makes {what}'s prepare() convert the model "
            f"to float8 itself: unset it (a float8 config trains in float8 through scalertune)"
        )
    if _accelerate_private.prepared_anything(accelerator):
        raise UsageError(f"{what} has prepared a model or optimizer already: {before}")
    if getattr(accelerator, ROUTE_ATTR, None) is not None:
        raise UsageError(
            f"{what} is attached to a runtime already: make a new one to attach another config"
        )


def route_accelerator(accelerator: Any, route: Route, *, training: bool) -> None:
    """Point ``accelerator``'s autocast and backward at ``route`` (see the module's
    docstring); with ``training``, its scaler and unscaling too."""
    setattr(accelerator, ROUTE_ATTR, route)
    _accelerate_private.leave_out_fp8(accelerator)  # the runtime's float8, or none
    accelerator.native_amp = False  # Accelerate's autocast wrapper: the route's runs instead
    accelerator.backward = functools.partial(_backward, accelerator, route)
    accelerator.prepare_model = functools.partial(
        _prepare_model, accelerator.prepare_model, route, training
    )
    if training:
        amp = route.runtime()
        accelerator.scaler = amp.scaler if amp.config.uses_scaler else None
        accelerator.unscale_gradients = functools.partial(_unscale, accelerator, route)
        accelerator.prepare_optimizer = functools.partial(
            _prepare_optimizer, accelerator.prepare_optimizer, route
        )


def keep_state(accelerator: Any, amp: AmpRuntime) -> None:
    """``save_state`` writes the runtime's state into its folder (``scalertune_amp.pt``,
    by the process that saves, before Accelerate's own files) and ``load_state`` restores it
    first, through Accelerate's public state hooks: a resumed run keeps what the check did.
    Not a registered object: Accelerate unpickles those with ``weights_only=False``, and
    refuses a checkpoint saved before ``attach`` for having one object less; this file is
    read ``weights_only``, and a checkpoint without it resumes with one line."""

    def save(models: Any, weights: Any, folder: str) -> None:
        on_each_node = accelerator.project_configuration.save_on_each_node
        if accelerator.is_local_main_process if on_each_node else accelerator.is_main_process:
            save_state(amp, folder)

    def load(models: Any, folder: str) -> None:
        load_state(amp, folder, stacklevel=3)  # the user's load_state, past Accelerate's

    accelerator.register_save_state_pre_hook(save)
    accelerator.register_load_state_pre_hook(load)


def _backward(accelerator: Any, route: Route, loss: Any, **kwargs: Any) -> None:
    kwargs.pop("learning_rate", None)  # LOMO's; its optimizers are not supported
    route.backward(loss / accelerator.gradient_accumulation_steps, **kwargs)


def _prepare_model(
    prepare: Any, route: Route, training: bool, model: Any, *args: Any, **kwargs: Any
) -> Any:
    prepared = prepare(model, *args, **kwargs)
    if training:  # a search's run applies its own config's islands
        route.runtime().prepare(model)  # float32 islands, on the module itself
    route.wrap_forward(prepared)
    return prepared


def _prepare_optimizer(
    prepare: Any, route: Route, optimizer: Any, *args: Any, **kwargs: Any
) -> Any:
    prepared = prepare(optimizer, *args, **kwargs)
    accelerated_step = type(prepared).step

    def step(self: Any, *step_args: Any, **step_kwargs: Any) -> Any:
        result = accelerated_step(self, *step_args, **step_kwargs)
        if not self.gradient_state.sync_gradients:  # accumulating: no optimizer step
            return result
        if self.scaler is not None:
            # what step_was_skipped reads: the runtime's verdict (a fused optimizer's is read
            # from the device here, as a Trainer reads the gradient norm every step anyway)
            _accelerate_private.set_step_skipped(self, not route.runtime().last_step)
        else:  # no scaler to count it
            route.runtime().steps += 1
        return result

    # a method of this object: an LR scheduler wraps the step method of its optimizer
    prepared.step = types.MethodType(step, prepared)
    return prepared


def _unscale(accelerator: Any, route: Route, optimizer: Any = None) -> None:
    """Accelerate's ``unscale_gradients``, with the runtime's scaler."""
    amp = route.runtime()
    if not amp.config.uses_scaler:
        return
    if optimizer is None:
        optimizers = _accelerate_private.prepared_optimizers(accelerator)
    else:
        optimizers = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    for opt in optimizers:
        while hasattr(opt, "optimizer") and hasattr(opt, "scaler"):  # AcceleratedOptimizer
            opt = opt.optimizer
        amp.scaler.unscale_(opt)
