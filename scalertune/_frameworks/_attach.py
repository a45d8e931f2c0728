"""``scalertune.attach``: put a search's answer into the trainer a user already has."""

from __future__ import annotations

import os
from typing import Any

import torch

from scalertune._amp._check import CheckPolicy
from scalertune._amp._config import AmpConfig
from scalertune._amp._runtime import AmpRuntime
from scalertune._errors import UsageError
from scalertune._frameworks import _accelerate, _deepspeed, _lightning, _transformers
from scalertune._frameworks._detect import trainer_framework
from scalertune._frameworks._route import Route
from scalertune._inrun._build import in_run_check, runtime_from_yaml


def attach(
    trainer: Any,
    config: str | os.PathLike[str] | AmpConfig | AmpRuntime,
    *,
    guard: bool = True,
    watch: bool = True,
    best_amp: bool = False,
    check: bool | str | CheckPolicy | None = None,
) -> AmpRuntime:
    """:func:`scalertune.attach` without the study's record of the run (see there)."""
    kind, device = _kind(trainer)
    deepspeed = kind == "transformers" and _deepspeed.is_deepspeed_trainer(trainer)
    if deepspeed:  # the in-run check left out (see _deepspeed.CHECK_LEFT_OUT), said if asked
        if check is not None and check is not False:
            _deepspeed.say_check_left_out()
        check = False
    amp = _runtime(config, device, guard=guard, watch=watch, best_amp=best_amp, check=check)
    if deepspeed:
        _deepspeed.attach_trainer(trainer, amp)  # DeepSpeed's engine, its own loss scaler
    elif kind == "transformers":
        _transformers.check_trainer(trainer)
        _transformers.route_trainer(trainer, Route(amp), training=True)
    elif kind == "accelerate":
        _accelerate.check_accelerator(trainer)
        _accelerate.route_accelerator(trainer, Route(amp), training=True)
        _accelerate.keep_state(trainer, amp)  # save_state/load_state keep the runtime's state
    else:
        _lightning.check_lightning(trainer)
        _lightning.route_lightning(trainer, amp)
    return amp


def _kind(trainer: Any) -> tuple[str, torch.device]:
    """Which framework ``trainer`` comes from, and the device it trains on."""
    kind = trainer_framework(trainer)
    if kind == "transformers":
        return kind, _transformers.trainer_device(trainer)
    if kind == "lightning":
        return kind, _lightning.lightning_device(trainer)
    if kind == "accelerate":
        return kind, torch.device(trainer.device)
    raise UsageError(
        f"cannot attach to a {type(trainer).__name__}: give a transformers.Trainer "
        "(before train()), a Lightning Trainer (before fit()) or an "
        "accelerate.Accelerator (before prepare()); for a loop of your own use "
        "scalertune.load"
    )


def _runtime(
    config: Any,
    device: torch.device,
    *,
    guard: bool,
    watch: bool,
    best_amp: bool,
    check: bool | str | CheckPolicy | None,
) -> AmpRuntime:
    if best_amp and not isinstance(config, (str, os.PathLike)):
        raise UsageError(
            "best_amp=True reads evidence.best_amp from a result YAML: give the "
            "YAML's path (an AmpConfig or a runtime is already one config)"
        )
    if isinstance(config, AmpRuntime):
        if config.device.type != device.type:
            raise UsageError(
                f"the runtime is for {config.device.type} and the trainer trains on "
                f"{device.type}: build it with device={device.type!r}"
            )
        return config
    if isinstance(config, AmpConfig):
        return AmpRuntime(config, device=device, check=in_run_check(None, check))
    if isinstance(config, (str, os.PathLike)):
        return runtime_from_yaml(
            config, device=device, guard=guard, watch=watch, best_amp=best_amp, check=check
        )
    raise UsageError(
        f"cannot attach a {type(config).__name__}: give the result YAML's path, "
        "an AmpConfig or an AmpRuntime"
    )
