"""An Accelerate ``Accelerator`` with what it prepares, as the workload.

The factory returns the Accelerator and the objects a training script passes to
``accelerator.prepare`` (the model, the optimizer, the training dataloader, the LR
schedulers), unprepared, with ``loss_fn`` or ``step`` as any workload has them. Each run routes
the Accelerator to the run's runtime (``_frameworks._accelerate``) and prepares the model and
the dataloader through it: its device placement, its DDP wrapping, its dataloader sharding
and seeding. Each step is an Accelerate training step:

- ``loss_fn``: forward, ``accelerator.backward(loss)`` (divided by the Accelerator's
  ``gradient_accumulation_steps``, whose micro-batches make one step), then the runtime's
  step (unscale, clip at ``clip_norm``, step unless skipped, update), the schedulers stepped
  only after a step the optimizer really took (as Accelerate's prepared schedulers are), and
  ``zero_grad``;
- ``step(model, batch, amp)``: your own, with the prepared model; call
  ``accelerator.backward(loss)`` (or ``amp.backward``) and ``amp.step(optimizer)``.
"""

from __future__ import annotations

from typing import Any

import torch

from scalertune._amp._device import check_same_device
from scalertune._errors import UsageError
from scalertune._frameworks._accelerate import check_accelerator, route_accelerator
from scalertune._frameworks._detect import ACCELERATE, trainer_framework
from scalertune._frameworks._route import Route
from scalertune._workload._contract import Workload, from_result
from scalertune._workload._groups import Groups


def accelerate_workload(result: dict[str, Any], *, device: torch.device) -> Workload:
    """The Workload of a factory's ``{"accelerator": ..., ...}`` (see the module's docstring)."""
    accelerator = result.pop("accelerator")
    if trainer_framework(accelerator) != ACCELERATE:
        raise UsageError(
            f"'accelerator' is a {type(accelerator).__name__}: give an accelerate.Accelerator"
        )
    check_accelerator(
        accelerator, before="return the Accelerator with what it will prepare, unprepared"
    )
    check_same_device(
        "the Accelerator",
        torch.device(accelerator.device),
        device,
        "or Accelerator(cpu=...) to match",
    )
    workload = from_result(result)
    route = Route()
    route_accelerator(accelerator, route, training=False)
    workload.model = accelerator.prepare_model(workload.model)
    loader = accelerator.prepare_data_loader(workload.batches)
    if workload.step is not None:
        user_step = workload.step

        def step(model: torch.nn.Module, batch: Any, amp: Any) -> torch.Tensor:
            route.amp = amp
            return user_step(model, batch, amp)

        workload.step, workload.batches = step, loader
        return workload
    workload.step = _loss_step(accelerator, route, workload)
    workload.batches = Groups(loader, accelerator.gradient_accumulation_steps)
    return workload


def _loss_step(accelerator: Any, route: Route, workload: Workload) -> Any:
    optimizer, loss_fn, schedulers = workload.optimizer, workload.loss_fn, workload.schedulers
    if loss_fn is None:
        raise UsageError("the factory's result has neither 'loss_fn' nor 'step': give one")

    def step(model: torch.nn.Module, group: list[Any], amp: Any) -> torch.Tensor:
        route.amp = amp
        losses = []
        for inputs, targets in group:
            loss = loss_fn(model(inputs), targets)
            accelerator.backward(loss)
            losses.append(loss.detach())
        if amp.step(optimizer):
            for scheduler in schedulers:
                scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return losses[0] if len(losses) == 1 else torch.stack(losses).mean()

    return step
