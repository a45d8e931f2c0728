"""``scalertune.attach``: put a search's answer into the trainer a user already has."""

from __future__ import annotations

import os
from typing import Any

import torch

from scalertune._amp._config import AmpConfig
from scalertune._amp._runtime import AmpRuntime
from scalertune._errors import UsageError
from scalertune._frameworks import _accelerate, _deepspeed, _lightning, _transformers
from scalertune._frameworks._route import Route


def attach(
    trainer: Any,
    config: str | os.PathLike[str] | AmpConfig | AmpRuntime,
    *,
    guard: bool = True,
    watch: bool = True,
    best_amp: bool = False,
) -> AmpRuntime:
    """Train ``trainer`` with the config a search chose; returns the runtime that does it.

    ``trainer`` is a Hugging Face ``transformers.Trainer`` (any subclass: TRL's, one with its
    own ``compute_loss``) before ``train()``, a Lightning ``Trainer`` before ``fit()``, or an
    Accelerate ``Accelerator`` before ``prepare()``. ``config`` is the result YAML a search
    wrote (or an :class:`AmpConfig`, or an :class:`AmpRuntime` built already). The training
    that follows runs:

    - the config's dtype under autocast, on a CPU as on a GPU, whatever ``fp16``, ``bf16``
      or ``precision`` the trainer was given (a float16 config trains in float16 on a CPU);
    - a GradScaler with exactly the config's ``init_scale``, ``growth_factor``,
      ``backoff_factor`` and ``growth_interval``, which the framework itself calls;
    - the config's clipping, as the framework's own, in place of the trainer's
      (``max_grad_norm``, ``gradient_clip_val`` by norm; a config without one turns it off;
      with an Accelerator, ``accelerator.clip_grad_norm_`` in your loop unscales with the
      runtime's scaler first);
    - its float32 islands, and the guard and the watch the YAML recommends
      (``guard=False``, ``watch=False`` to leave them out), on the steps the framework took.

    A Trainer made with ``deepspeed=`` trains in DeepSpeed's engine under DeepSpeed's own
    loss scaler: the YAML's ``fp16`` block (as a search of that Trainer found it), ``bf16``
    and ``gradient_clipping`` go into its DeepSpeed config before ``train()`` makes the
    engine, float16 is allowed on a CPU, and the runtime is bound to the engine, so that its
    ``skipped_steps`` and ``scale`` are DeepSpeed's own and the watch follows them (the
    guard is DeepSpeed's: it raises at ``min_loss_scale``).

    The runtime's ``skipped_steps``, ``steps`` and ``scaler.get_scale()`` read what the
    framework did. ``best_amp=True`` takes the YAML's best AMP config that held instead of its
    answer (for a GPU, when the search ran where float32 was faster). A trainer that the
    runtime cannot drive (FSDP, a model loaded in half precision, a trainer already trained
    or prepared, a DeepSpeed Trainer given an answer searched outside DeepSpeed) is refused
    with a :class:`UsageError` saying why.

    Example::

        trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset)
        amp = scalertune.attach(trainer, "amp.yaml")
        trainer.train()
        print(amp.skipped_steps, amp.scaler.get_scale())
    """
    kind, device = _kind(trainer)
    amp = _runtime(config, device, guard=guard, watch=watch, best_amp=best_amp)
    if kind == "transformers" and _deepspeed.is_deepspeed_trainer(trainer):
        _deepspeed.attach_trainer(trainer, amp)  # DeepSpeed's engine, its own loss scaler
    elif kind == "transformers":
        _transformers.check_trainer(trainer)
        _transformers.route_trainer(trainer, Route(amp), training=True)
    elif kind == "accelerate":
        _accelerate.check_accelerator(trainer)
        _accelerate.route_accelerator(trainer, Route(amp), training=True)
    else:
        _lightning.check_lightning(trainer)
        _lightning.route_lightning(trainer, amp)
    return amp


def _kind(trainer: Any) -> tuple[str, torch.device]:
    """Which framework ``trainer`` comes from, and the device it trains on."""
    if _transformers.is_trainer(trainer):
        return "transformers", _transformers.trainer_device(trainer)
    if _lightning.lightning_package(trainer, "Trainer") is not None:
        return "lightning", _lightning.lightning_device(trainer)
    if any(
        cls.__name__ == "Accelerator" and cls.__module__.startswith("accelerate")
        for cls in type(trainer).__mro__
    ):
        return "accelerate", torch.device(trainer.device)
    raise UsageError(
        f"cannot attach to a {type(trainer).__name__}: give a transformers.Trainer "
        "(before train()), a Lightning Trainer (before fit()) or an "
        "accelerate.Accelerator (before prepare()); for a loop of your own use "
        "scalertune.load"
    )


def _runtime(
    config: Any, device: torch.device, *, guard: bool, watch: bool, best_amp: bool
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
        return AmpRuntime(config, device=device)
    if isinstance(config, (str, os.PathLike)):
        return AmpRuntime.from_yaml(
            os.fspath(config), device=device, guard=guard, watch=watch, best_amp=best_amp
        )
    raise UsageError(
        f"cannot attach a {type(config).__name__}: give the result YAML's path, "
        "an AmpConfig or an AmpRuntime"
    )
