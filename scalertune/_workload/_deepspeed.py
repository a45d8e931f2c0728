"""A DeepSpeed workload: a factory that returns the DeepSpeed config it trains with.

``{"model": module, "batches": ..., "loss_fn": ..., "deepspeed": config}``, where ``config``
is the dict (or the path of the ``ds_config.json``) that ``deepspeed.initialize`` takes, and
``optimizer`` is a torch optimizer over the model's parameters unless the config names one
(``"optimizer": {"type": "Adam", ...}``); ``step``, ``schedulers`` and ``horizon`` as any
workload has them. The model and the optimizer are returned as they are before
``deepspeed.initialize``: each run makes its own engine.

Each run trains in a DeepSpeed engine made from that config with the run's precision
(:func:`~scalertune._frameworks._deepspeed.engine_config`): the run's ``fp16`` block (the
scaler knobs the search tries) for float16, ``bf16`` for bfloat16, neither for the float32
reference, the same ZeRO stage, optimizer and batches throughout, and the run's
``gradient_clipping``. The engine is made at the run's first step, on the factory's own
model and optimizer; where one run needs a second precision (the step timing interleaves
them), that engine is made on a fresh call of the factory. Each step is DeepSpeed's:

- the floating tensors of the inputs cast to the engine's dtype (as ``fp16.auto_cast`` and a
  Hugging Face Trainer cast them), ``loss = loss_fn(engine(inputs), targets)``;
- ``engine.backward(loss)``, then ``engine.step()``, through the run's runtime, to which the
  engine is bound: the skipped steps and the scale are the engine's;
- with ``gradient_accumulation_steps`` above 1, that many micro-batches make one step;
- ``step(engine, batch, amp)`` instead, where given: call ``amp.backward(loss)`` and
  ``amp.step(optimizer)`` in it.

The workload's own clipping is the config's ``gradient_clipping`` (1.0 where it says none,
as DeepSpeed clips then).
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from scalertune._amp._config import AmpConfig
from scalertune._errors import UsageError
from scalertune._frameworks import _deepspeed, _deepspeed_private
from scalertune._frameworks._transformers import micro_batch, trainer_device
from scalertune._workload._contract import Workload, from_result
from scalertune._workload._groups import Groups
from scalertune._workload._transformers import Counters, set_epoch, the_trainers

#: DeepSpeed's gradient clipping where a config has no ``gradient_clipping``.
DEFAULT_CLIPPING = 1.0


def deepspeed_workload(
    result: dict[str, Any], *, device: torch.device, again: Callable[[], Any]
) -> Workload:
    """The Workload of a factory's ``{"deepspeed": config, ...}`` (see the module's
    docstring); ``again`` calls the factory afresh (seeded as this call was)."""
    config = read_config(result.pop("deepspeed"))
    _deepspeed.check_config(config)
    _refuse_engines(result)
    if "optimizer" in config and result.get("optimizer") is not None:
        raise UsageError(
            "the factory gives an optimizer and the DeepSpeed config names one too, which "
            "DeepSpeed refuses: drop one of them"
        )
    if "optimizer" not in config and result.get("optimizer") is None:
        raise UsageError(
            "the factory's result has no optimizer and its DeepSpeed config names none: "
            'return \'optimizer\', or name one in the config ("optimizer": {"type": ...})'
        )
    if "clip_norm" in result:
        raise UsageError(
            "with 'deepspeed' the clipping is the config's gradient_clipping: drop 'clip_norm'"
        )
    engines = Engines(
        (result["model"], result.get("optimizer")),
        config,
        model=result["model"],
        make=_factory_engine,
        again=lambda: _model_and_optimizer(again(), result["model"]),
    )
    optimizer = EngineOptimizer(engines)
    workload = from_result({**result, "optimizer": optimizer})
    clipping = config.get("gradient_clipping", DEFAULT_CLIPPING)
    workload.clip_norm = float(clipping) if clipping else None
    workload.step = _step(engines, workload)
    accumulate = _accumulation(config)
    if accumulate > 1 and result.get("step") is None:
        workload.batches = Groups(workload.batches, accumulate)
    return workload


def engine_facts(workload: Workload) -> dict[str, Any] | None:
    """What a study keeps of a DeepSpeed workload's engine: its ZeRO stage, whether the
    device runs bfloat16 (DeepSpeed's accelerator says), its config, and whether its loss is
    float16 under fp16 (``half_loss``, seen at a float32 step); ``None`` for another
    workload."""
    optimizer = workload.optimizer
    if not isinstance(optimizer, EngineOptimizer):
        return None
    facts = _deepspeed.engine_facts(optimizer.engines.config)
    if optimizer.engines.half_loss:
        facts["half_loss"] = True
    return facts


def read_config(config: Any) -> dict[str, Any]:
    """The DeepSpeed config as a dict: given, or read from the JSON file it names."""
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        try:
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read the DeepSpeed config {path}: {exc}") from None
    if not isinstance(config, Mapping):
        raise UsageError(
            f"'deepspeed' is a {type(config).__name__}: give the config dict, or the path "
            "of ds_config.json"
        )
    if _has_auto(config):
        raise UsageError(
            "the DeepSpeed config has 'auto' values, which only a Hugging Face Trainer fills "
            "in: give numbers (or return the Trainer made with deepspeed=config)"
        )
    return dict(config)


def _has_auto(value: Any) -> bool:
    """Whether ``value`` (a config, or a part of one) holds the value ``"auto"`` somewhere,
    which a Hugging Face Trainer fills in: a key such as ``fp16.auto_cast`` is DeepSpeed's own.

    Example:
        >>> _has_auto({"fp16": {"enabled": True, "auto_cast": True}}), _has_auto({"lr": "auto"})
        (False, True)
    """
    if isinstance(value, str):
        return value == "auto"
    if isinstance(value, Mapping):
        return any(_has_auto(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_auto(v) for v in value)
    return False


def _refuse_engines(result: Mapping[str, Any]) -> None:
    """An engine ``deepspeed.initialize`` already made has its precision fixed: refused."""
    for key in ("model", "optimizer"):
        value = result.get(key)
        if _deepspeed_private.made_by_initialize(value):
            _deepspeed.refuse_deepspeed(f"the factory's {key}", "initialized")


def _factory_engine(
    source: tuple[torch.nn.Module, Any], config: dict[str, Any], amp_config: AmpConfig
) -> _deepspeed.DeepSpeedRun:
    model, optimizer = source
    return _deepspeed.DeepSpeedRun(_deepspeed.initialize(model, optimizer, config), source)


def _model_and_optimizer(result: Any, first: torch.nn.Module) -> tuple[torch.nn.Module, Any]:
    """A fresh factory result's model (on the first one's device) and optimizer."""
    return result["model"].to(next(first.parameters()).device), result.get("optimizer")


def _accumulation(config: Mapping[str, Any]) -> int:
    steps = config.get("gradient_accumulation_steps", 1)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise UsageError(
            f"the DeepSpeed config's gradient_accumulation_steps must be an integer >= 1, "
            f"got {steps!r}"
        )
    return steps


#: Makes a run's engine: from its source (what the factory returned: a model and optimizer,
#: or a Trainer), the DeepSpeed config with the run's precision, and the run's config.
Make = Callable[[Any, dict[str, Any], AmpConfig], _deepspeed.DeepSpeedRun]


class Engines:
    """The DeepSpeed engines of one workload, one per precision config, each made at its
    first step: from what the factory returned first, from a fresh call of the factory after
    (see the module's docstring)."""

    def __init__(
        self,
        source: Any,
        config: dict[str, Any],
        *,
        model: torch.nn.Module,
        make: Make,
        again: Callable[[], Any],
    ) -> None:
        if not isinstance(model, torch.nn.Module):
            raise UsageError(f"'model' is a {type(model).__name__}: return a torch.nn.Module")
        self.source, self.config, self.model = source, config, model
        self._make, self._again = make, again
        self._runs: dict[str, _deepspeed.DeepSpeedRun] = {}
        self._keys: dict[AmpConfig, str] = {}
        self._configs: dict[str, dict[str, Any]] = {}
        self.current: _deepspeed.DeepSpeedRun | None = None
        #: A checkpoint's optimizer state, for the engine still to be made.
        self.pending: Mapping[str, Any] | None = None
        #: Whether the loss is float16 under fp16 (found at the first float32 step).
        self.half_loss: bool | None = None

    def run_for(self, config: AmpConfig) -> _deepspeed.DeepSpeedRun:
        """The engine ``config`` trains in, made now if it is new."""
        key = self._keys.get(config)
        if key is None:  # the config's engine config, made once (a step asks every time)
            wanted = _deepspeed.engine_config(self.config, config)
            key = self._keys[config] = json.dumps(wanted, sort_keys=True, default=repr)
            self._configs[key] = wanted
        run = self._runs.get(key)
        if run is None:
            source = self._again() if self._runs else self.source
            _deepspeed.quiet_overflows()
            run = self._make(source, self._configs[key], config)
            if self.pending is not None:
                restore(run, self.pending)
                self.pending = None
            self._runs[key] = run
        self.current = run
        return run


class EngineOptimizer(torch.optim.Optimizer):
    """A DeepSpeed workload's optimizer as a run sees it: the factory's (or none, where the
    config names it) until the engine is made, then the engine's. A checkpoint takes its
    whole state, parameter by parameter, with the float32 master weights, whatever the
    precision and the ZeRO stage (:func:`~scalertune._frameworks._deepspeed.full_state`)."""

    def __init__(self, engines: Engines) -> None:  # no parameters of its own to hand on
        self.engines = self._engines = engines

    # Optimizer's attributes, read through the engine here: properties
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        run = self._engines.current
        if run is not None:
            groups: list[dict[str, Any]] = run.engine.optimizer.param_groups
            return groups
        given = self._engines.source[1] if isinstance(self._engines.source, tuple) else None
        return given.param_groups if given is not None else []

    @property
    def state(self) -> Any:  # type: ignore[override]
        run = self._engines.current
        if run is not None:
            return _deepspeed_private.base_optimizer(run.engine).state
        return {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        run = self._engines.current
        if run is not None:
            run.zero_grad()
        else:
            self._engines.model.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:
        raise RuntimeError("a DeepSpeed workload's optimizer steps in its engine (amp.step)")

    def state_dict(self) -> dict[str, Any]:
        run = self._engines.current
        if run is None:
            raise RuntimeError("no DeepSpeed engine is made yet: nothing to save")
        scheduler = getattr(run.source, "lr_scheduler", None)  # a Trainer's own
        return {
            "deepspeed": _deepspeed.full_state(run.engine),
            "scheduler": None if scheduler is None else scheduler.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        run = self._engines.current
        if run is not None:
            restore(run, state_dict)
        else:
            self._engines.pending = state_dict


def restore(run: _deepspeed.DeepSpeedRun, state: Mapping[str, Any]) -> None:
    """Put a run's engine (and a Trainer's LR scheduler) in a checkpoint's state."""
    _deepspeed.load_full_state(run.engine, state["deepspeed"])
    scheduler = getattr(run.source, "lr_scheduler", None)
    if scheduler is not None and state.get("scheduler") is not None:
        scheduler.load_state_dict(state["scheduler"])


def _step(engines: Engines, workload: Workload) -> Any:
    """One step of the workload in the engine of the runtime's config."""
    user_step, loss_fn, optimizer = workload.step, workload.loss_fn, workload.optimizer

    def step(model: torch.nn.Module, batch: Any, amp: Any) -> torch.Tensor:
        run = engines.run_for(amp.config)
        amp.bind(run)
        if user_step is not None:
            return user_step(run.engine, batch, amp)
        group = (
            batch if isinstance(batch, list) and isinstance(workload.batches, Groups) else [batch]
        )
        dtype = _deepspeed.dtype_of(amp.config)
        losses = []
        for k, (inputs, targets) in enumerate(group):
            output = run.engine(_cast(inputs, dtype))
            loss = loss_fn(output, targets)  # type: ignore[misc]
            if engines.half_loss is None and amp.config.dtype == "float32":
                engines.half_loss = _half_loss(loss_fn, output, targets)  # type: ignore[arg-type]
            amp.backward(loss)
            if k < len(group) - 1:
                run.micro_step()
            losses.append(loss.detach().float())
        amp.step(optimizer)
        return losses[0] if len(losses) == 1 else torch.stack(losses).mean()

    return step


def _half_loss(loss_fn: Callable[[Any, Any], torch.Tensor], output: Any, targets: Any) -> bool:
    """Whether ``loss_fn`` gives a float16 loss for the model's float16 output (a
    cross-entropy of float16 logits does; a loss against float32 targets is float32): then
    DeepSpeed's backward starts from the loss scale itself in float16, which overflows at
    65520 and above whatever the gradients are."""
    with torch.no_grad():
        return bool(loss_fn(_cast(output, torch.float16), targets).dtype == torch.float16)


def _cast(inputs: Any, dtype: torch.dtype) -> Any:
    """The floating tensors of ``inputs`` (nested tuples, lists, mappings) in ``dtype``."""
    if isinstance(inputs, torch.Tensor):
        return inputs.to(dtype) if inputs.is_floating_point() else inputs
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(_cast(v, dtype) for v in inputs)
    if isinstance(inputs, Mapping):
        return {k: _cast(v, dtype) for k, v in inputs.items()}
    return inputs


def deepspeed_trainer_workload(
    trainer: Any, *, device: torch.device, horizon: int | None, again: Callable[[], Any]
) -> Workload:
    """The Workload of a Hugging Face Trainer made with ``deepspeed=`` (TRL's trainers
    included): what its ``train()`` trains, step for step, in the engine its own
    ``deepspeed_init`` and ``accelerator.prepare`` make, with each run's precision in its
    DeepSpeed config (its ``fp16`` block, ``bf16``, ``gradient_clipping``)."""
    config = copy.deepcopy(_deepspeed.trainer_config(trainer))
    _deepspeed.check_config(config, what="the Trainer's DeepSpeed config", trainer=trainer)
    if _deepspeed.trainer_engine(trainer) is not None:
        _deepspeed.refuse_deepspeed(
            "the Trainer", "trained", todo="return the Trainer before train() (or a new one)"
        )
    if trainer_device(trainer).type != device.type:
        raise UsageError(
            f"the Trainer trains on {trainer_device(trainer).type} and the search runs on "
            f"{device.type}: give --device {trainer_device(trainer).type}"
        )
    args = trainer.args
    with the_trainers("dataloader"):
        loader = trainer.get_train_dataloader()
        max_steps = trainer.set_initial_training_values(args, loader)[-1]
    trainer.state.max_steps = max_steps
    engines = Engines(
        trainer,
        config,
        model=trainer.model,
        make=functools.partial(_trainer_run, max_steps=max_steps),
        again=lambda: _trainer_of(again()),
    )
    clipping = config.get("gradient_clipping", DEFAULT_CLIPPING)
    return Workload(
        model=trainer.model,
        optimizer=EngineOptimizer(engines),
        step=_trainer_step(engines),
        batches=Groups(
            loader, args.gradient_accumulation_steps, on_epoch=functools.partial(set_epoch, loader)
        ),
        clip_norm=float(clipping) if clipping else None,
        schedulers=[Counters(trainer)],
        horizon=horizon or max_steps,
    )


def _trainer_of(result: Any) -> Any:
    """The Trainer of a fresh factory result (alone, or under ``trainer``)."""
    trainer = result["trainer"] if isinstance(result, Mapping) else result
    trainer.state.max_steps = 0
    return trainer


def _trainer_run(
    trainer: Any, config: dict[str, Any], amp_config: AmpConfig, *, max_steps: int
) -> _deepspeed.DeepSpeedRun:
    """A Trainer's engine with a run's precision, its Accelerator's backward through the
    run's runtime (DeepSpeed's backward, and its step where Accelerate's takes it)."""
    _deepspeed.set_trainer_precision(trainer, config)
    engine = _deepspeed.init_trainer_engine(trainer, max_steps)
    run = _deepspeed.DeepSpeedRun(engine, source=trainer)
    backward = functools.partial(_deepspeed.trainer_backward, trainer, run)
    _deepspeed.replace_trainer_backward(trainer, backward)
    return run


def _trainer_step(engines: Engines) -> Any:
    """One optimizer step of the Trainer, as its ``train()`` takes it: each micro-batch
    through ``training_step`` (whose backward is the engine's), the Trainer's LR scheduler
    stepped after a step the engine applied."""

    def step(model: torch.nn.Module, group: list[Any], amp: Any) -> torch.Tensor:
        run = engines.run_for(amp.config)
        amp.bind(run)
        run.amp, run.applied, trainer = amp, False, run.source
        micro, items = trainer.get_batch_samples(iter(group), len(group), trainer.args.device)
        trainer.current_gradient_accumulation_steps = len(micro)
        losses = []
        for i, inputs in enumerate(micro):
            micro_batch(trainer, trainer.model, i == len(micro) - 1)
            losses.append(trainer.training_step(run.engine, inputs, items))
        trainer.optimizer.step()  # Accelerate's wrapper: the engine stepped in backward
        scheduler = trainer.lr_scheduler
        if run.applied and not isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            scheduler.step()
        trainer.state.global_step += 1
        loss: torch.Tensor = sum(losses)
        return loss

    return step
