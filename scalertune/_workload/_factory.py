"""Calling the factory: seeded, its result read as a workload, checked, on the device.

A factory returns a :class:`~scalertune.Workload` (or a mapping of its fields), or the
trainer the user already has:

- a Hugging Face ``transformers.Trainer`` (any subclass: TRL's trainers, one with its own
  ``compute_loss``), alone or as ``{"trainer": trainer, "horizon": N}``;
- a Lightning ``Trainer`` with its module and data:
  ``{"trainer": trainer, "model": lightning_module, "batches": dataloader_or_datamodule}``;
- an Accelerate ``Accelerator`` with what it prepares: ``{"accelerator": accelerator,
  "model": ..., "optimizer": ..., "batches": ..., "loss_fn": ...}`` and the other Workload
  keys (``step``, ``schedulers``, ``clip_norm``, ``horizon``);
- a DeepSpeed config with what it trains: ``{"deepspeed": config, "model": ...,
  "batches": ..., "loss_fn": ...}``, the optimizer given or named in the config.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn

import torch

from scalertune._errors import ExitCalled, UsageError
from scalertune._frameworks._deepspeed import is_deepspeed_trainer
from scalertune._frameworks._detect import LIGHTNING, TRANSFORMERS, trainer_framework
from scalertune._workload._accelerate import accelerate_workload
from scalertune._workload._contract import Workload, check_workload, from_result
from scalertune._workload._deepspeed import deepspeed_trainer_workload, deepspeed_workload
from scalertune._workload._lightning import lightning_trainer_workload
from scalertune._workload._loader import FactoryError, one_line
from scalertune._workload._rng import kept_rng, seed_everything
from scalertune._workload._transformers import transformers_workload


def build_workload(factory: Callable[[], Any], *, seed: int, device: torch.device) -> Workload:
    """Seed, call the factory, read and check what it returned, and move the model to
    ``device``.

    Raises :class:`UsageError` for a result of the wrong shape and :class:`FactoryError`
    when the factory itself raises.
    """
    seed_everything(seed)
    result = _call(factory)

    def again() -> Any:  # the factory afresh, as seeded, the run's RNGs left as they are
        with kept_rng():
            seed_everything(seed)
            return _call(factory)

    workload = read_result(result, device=device, again=again)
    check_workload(workload)
    workload.model.to(device)
    return workload


def _call(factory: Callable[[], Any]) -> Any:
    try:
        with _quiet_frameworks():
            return factory()
    except KeyboardInterrupt:
        raise
    except ExitCalled as exc:
        raise FactoryError(
            f"called os._exit({exc.code!r}), which ends the whole search: return instead",
            raised=False,
        ) from exc
    except BaseException as exc:  # SystemExit, and the odd class derived from BaseException
        raise FactoryError(one_line(exc)) from exc


@contextlib.contextmanager
def exits_raised() -> Iterator[None]:
    """While the user's code runs in the search's own process, ``os._exit(code)`` in it raises
    :class:`~scalertune._errors.ExitCalled` (a ``SystemExit``), where it ended the search at
    once with that status, nothing written and nothing said (a factory's ``os._exit(0)``: a
    search that "finished" with exit 0). In a process forked from this one (a DataLoader's
    worker, which ends with ``os._exit`` as it should), and once the user's code is done, it
    is Python's own; a run in a process of its own (``--isolate``) needs none: its parent
    sees the process end without a result. Nested, the outer one stands."""
    real = os._exit
    if getattr(real, "raised_by_scalertune", False):
        yield
        return
    owner = os.getpid()

    def raised(code: int) -> NoReturn:
        if os.getpid() != owner:
            real(code)
        raise ExitCalled(code)

    raised.raised_by_scalertune = True  # type: ignore[attr-defined]
    os._exit = raised  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = real


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


def read_result(
    result: Any, *, device: torch.device, again: Callable[[], Any] | None = None
) -> Workload:
    """The workload a factory's result describes (see the module's docstring); ``again``
    calls the factory afresh, for a DeepSpeed workload's second engine."""
    kind = trainer_framework(result)
    if kind == TRANSFORMERS:
        return _trainer_workload(result, device=device, horizon=None, again=again)
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
    if "deepspeed" in result:
        return deepspeed_workload(dict(result), device=device, again=again or _no_second)
    if "trainer" not in result:
        return from_result(result)
    trainer = result["trainer"]
    kind = trainer_framework(trainer)
    if kind == TRANSFORMERS:
        _only(result, ("trainer", "horizon"), "a Hugging Face Trainer")
        return _trainer_workload(trainer, device=device, horizon=result.get("horizon"), again=again)
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


def _trainer_workload(
    trainer: Any, *, device: torch.device, horizon: int | None, again: Callable[[], Any] | None
) -> Workload:
    """A Hugging Face Trainer as the workload: in DeepSpeed's engine where it was made with
    ``deepspeed=``, else under the run's runtime through its Accelerator."""
    if is_deepspeed_trainer(trainer):
        return deepspeed_trainer_workload(
            trainer, device=device, horizon=horizon, again=again or _no_second
        )
    return transformers_workload(trainer, device=device, horizon=horizon)


def _no_second() -> Any:
    raise RuntimeError("this DeepSpeed workload was read without its factory: one engine only")


def _only(result: Mapping[str, Any], keys: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(result) - set(keys))
    if unknown:
        verb = "comes" if len(unknown) == 1 else "come"
        raise UsageError(
            f"with {what} the factory's result takes {', '.join(keys)}; "
            f"{', '.join(map(repr, unknown))} {verb} from the trainer itself"
        )
