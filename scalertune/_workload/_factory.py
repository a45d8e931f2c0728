"""Calling the factory: seeded, its result read as a workload, checked, on the device.

A factory returns a :class:`~scalertune.Workload` (or a mapping of its fields), or the
trainer the user already has:

- a Hugging Face ``transformers.Trainer`` (any subclass: TRL's trainers, one with its own
  ``compute_loss``), alone or as ``{"trainer": trainer, "horizon": N}``;
- a Lightning ``Trainer`` with its module and data:
  ``{"trainer": trainer, "model": lightning_module, "batches": dataloader_or_datamodule}``;
- an Accelerate ``Accelerator`` with what it prepares: ``{"accelerator": accelerator,
  "model": ..., "optimizer": ..., "batches": ..., "loss_fn": ...}`` and the other Workload
  keys (``step``, ``schedulers``, ``clip_norm``, ``horizon``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from scalertune._errors import UsageError
from scalertune._frameworks._detect import LIGHTNING, TRANSFORMERS, trainer_framework
from scalertune._workload._accelerate import accelerate_workload
from scalertune._workload._contract import Workload, check_workload, from_result
from scalertune._workload._lightning import lightning_trainer_workload
from scalertune._workload._loader import FactoryError, one_line
from scalertune._workload._rng import seed_everything
from scalertune._workload._transformers import transformers_workload


def build_workload(factory: Callable[[], Any], *, seed: int, device: torch.device) -> Workload:
    """Seed, call the factory, read and check what it returned, and move the model to
    ``device``.

    Raises :class:`UsageError` for a result of the wrong shape and :class:`FactoryError`
    when the factory itself raises.
    """
    seed_everything(seed)
    try:
        with _quiet_frameworks():
            result = factory()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit, and the odd class derived from BaseException
        raise FactoryError(one_line(exc)) from exc
    workload = read_result(result, device=device)
    check_workload(workload)
    workload.model.to(device)
    return workload


@contextlib.contextmanager
def _quiet_frameworks() -> Iterator[None]:
    """Info logs off while the factory builds a trainer (a factory is called for every run of
    a search, and Lightning greets every new Trainer: "GPU available", tips); warnings stay.
    Process-wide for the call, since a framework imported by the factory sets its own
    loggers' levels as it loads."""
    before = logging.root.manager.disable
    logging.disable(max(before, logging.INFO))
    try:
        yield
    finally:
        logging.disable(before)


def read_result(result: Any, *, device: torch.device) -> Workload:
    """The workload a factory's result describes (see the module's docstring)."""
    kind = trainer_framework(result)
    if kind == TRANSFORMERS:
        return transformers_workload(result, device=device)
    if kind == LIGHTNING:
        raise UsageError(
            "a Lightning Trainer comes with its LightningModule and data: return "
            "{'trainer': trainer, 'model': module, 'batches': train_dataloader "
            "or datamodule}"
        )
    if not isinstance(result, Mapping):
        return from_result(result)
    if "accelerator" in result:
        return accelerate_workload(dict(result), device=device)
    if "trainer" not in result:
        return from_result(result)
    trainer = result["trainer"]
    kind = trainer_framework(trainer)
    if kind == TRANSFORMERS:
        _only(result, ("trainer", "horizon"), "a Hugging Face Trainer")
        return transformers_workload(trainer, device=device, horizon=result.get("horizon"))
    if kind == LIGHTNING:
        _only(result, ("trainer", "model", "batches", "horizon"), "a Lightning Trainer")
        if "model" not in result or "batches" not in result:
            raise UsageError(
                "a Lightning Trainer comes with its LightningModule and data: "
                "return {'trainer': trainer, 'model': module, 'batches': "
                "train_dataloader or datamodule}"
            )
        return lightning_trainer_workload(
            trainer,
            result["model"],
            result["batches"],
            device=device,
            horizon=result.get("horizon"),
        )
    raise UsageError(
        f"'trainer' is a {type(trainer).__name__}: give a transformers.Trainer or "
        "a Lightning Trainer (an Accelerator goes under 'accelerator')"
    )


def _only(result: Mapping[str, Any], keys: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(result) - set(keys))
    if unknown:
        verb = "comes" if len(unknown) == 1 else "come"
        raise UsageError(
            f"with {what} the factory's result takes {', '.join(keys)}; "
            f"{', '.join(map(repr, unknown))} {verb} from the trainer itself"
        )
