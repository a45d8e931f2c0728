"""A Hugging Face ``Trainer`` as the workload: what it would train, step for step.

The search takes from the Trainer what its ``train()`` takes, through the Trainer's own
methods, so a subclass's overrides (TRL's trainers, a ``compute_loss`` of your own) are what
runs:

- the model, and the optimizer and LR scheduler ``create_optimizer`` and
  ``create_scheduler`` build from ``TrainingArguments`` (the schedule as long as the
  training: ``max_steps``, or the epochs times the optimizer steps per epoch);
- the training dataloader ``get_train_dataloader`` prepares (its collator, sampler and
  seed), told the epoch before each pass as ``train()`` tells it;
- each optimizer step's ``gradient_accumulation_steps`` micro-batches (the last of an epoch
  takes what is left), counted as the Trainer counts them (``get_batch_samples``), each
  through the Trainer's ``training_step``, hence its ``compute_loss`` and its loss
  normalisation; the Accelerator's ``backward`` is the run's (``_frameworks``);
- under ``--nproc-per-node``, the model wrapped by the Trainer's Accelerator (DDP), the
  gradients all-reduced after each step's last micro-batch only (``no_sync`` before);
- ``max_grad_norm`` as the workload's own clipping, and the scheduler stepped only after a
  step the optimizer really took, as the Trainer does.

Nothing else of ``train()`` runs inside a trial: no logging, progress bar, evaluation,
checkpoint saving or ``report_to`` integration.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

from scalertune._amp._device import check_same_device
from scalertune._errors import UsageError
from scalertune._frameworks._route import Route
from scalertune._frameworks._transformers import (
    check_trainer,
    micro_batch,
    ranks_model,
    route_trainer,
    trainer_device,
)
from scalertune._workload._contract import Workload
from scalertune._workload._groups import Groups
from scalertune._workload._loader import one_line


def transformers_workload(
    trainer: Any, *, device: torch.device, horizon: int | None = None
) -> Workload:
    """The Workload that trains what ``trainer.train()`` would (see the module's docstring)."""
    check_trainer(trainer, before="return the Trainer before train() (or a new one)")
    check_same_device(
        "the Trainer", trainer_device(trainer), device, "or TrainingArguments(use_cpu=...) to match"
    )
    route = Route()
    route_trainer(trainer, route, training=False)
    args = trainer.args
    with _the_trainers("dataloader"):
        loader = trainer.get_train_dataloader()
        max_steps = trainer.set_initial_training_values(args, loader)[-1]
    with _the_trainers("optimizer and scheduler"):
        optimizer = trainer.create_optimizer()
        scheduler = trainer.create_scheduler(num_training_steps=max_steps, optimizer=optimizer)
    trainer.state.max_steps = max_steps
    counters = _Counters(trainer)
    plateau = isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)

    def step(model: torch.nn.Module, group: list[Any], amp: Any) -> torch.Tensor:
        route.amp = amp
        micro, items = trainer.get_batch_samples(iter(group), len(group), args.device)
        trainer.current_gradient_accumulation_steps = len(micro)
        loss: torch.Tensor = sum(
            _micro_step(trainer, model, inputs, items, i == len(micro) - 1)
            for i, inputs in enumerate(micro)
        )
        if amp.step(optimizer) and not plateau:
            scheduler.step()
        model.zero_grad()
        trainer.state.global_step += 1
        return loss

    return Workload(
        model=ranks_model(trainer),
        optimizer=optimizer,
        step=step,
        batches=Groups(
            loader, args.gradient_accumulation_steps, on_epoch=functools.partial(_set_epoch, loader)
        ),
        clip_norm=args.max_grad_norm if args.max_grad_norm > 0 else None,
        schedulers=[scheduler, counters],
        horizon=horizon or max_steps,
    )


def _micro_step(trainer: Any, model: torch.nn.Module, inputs: Any, items: Any, last: bool) -> Any:
    """One micro-batch through ``training_step``; with ranks, the gradients all-reduced
    after the last micro-batch only, as ``train()`` does (:func:`micro_batch`)."""
    if model is trainer.model:
        return trainer.training_step(model, inputs, items)
    with micro_batch(trainer, model, last):
        return trainer.training_step(model, inputs, items)


@contextlib.contextmanager
def _the_trainers(what: str) -> Iterator[None]:
    """The Trainer's own refusal (no train_dataset, no max_steps for a dataset without a
    length) as one line, as train() would raise it."""
    try:
        yield
    except (ValueError, TypeError, AttributeError) as exc:
        raise UsageError(f"the Trainer's {what}: {one_line(exc)}") from None


def _set_epoch(loader: Any, epoch: int) -> None:
    """What ``Trainer.train()`` tells the dataloader before each epoch."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    # Accelerate's set_epoch does not reach a batch sampler wrapped in BatchSamplerShard
    inner: Any = getattr(getattr(loader, "batch_sampler", None), "batch_sampler", None)
    if inner is not None and hasattr(inner, "set_epoch"):
        inner.set_epoch(epoch)


class _Counters:
    """The Trainer's step counter, saved and restored with a checkpoint (a ``training_step``
    may read ``self.state.global_step``)."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer
        trainer.state.global_step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"global_step": self._trainer.state.global_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._trainer.state.global_step = state["global_step"]
