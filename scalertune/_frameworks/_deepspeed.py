"""DeepSpeed's engine under a runtime: a run's precision in the user's DeepSpeed config, the
engine made from it and bound to the run's runtime, a Hugging Face Trainer made with
``deepspeed=`` trained the same way, and the one refusal of what scalertune does not train
in DeepSpeed (:func:`refuse_deepspeed`).

DeepSpeed keeps mixed precision to its engine: its ``fp16`` mode casts the model to float16,
scales the loss in ``engine.backward`` with its own dynamic loss scaler and unscales, clips
and steps (or skips) in ``engine.step``; its ``bf16`` mode casts to bfloat16 without a
scaler. A run of a DeepSpeed workload trains in such an engine, built from the user's config
with the run's precision (:func:`engine_config`), and bound to the run's runtime through
:class:`DeepSpeedRun`: the runtime's skipped steps, the guard and the watch read what the
engine decided (``engine.was_step_applied()``) and its scale.

What of DeepSpeed is relied on beyond its documented API is in ``_deepspeed_private``, and
what a Trainer made with ``deepspeed=`` relies on of Accelerate and transformers is in
``_accelerate_private`` and ``_transformers_private``: each entry checked by a test, and the
releases checked when a DeepSpeed workload or Trainer is handed over. DeepSpeed is imported where it
is used: it is no dependency of scalertune.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import json
import logging
import math
import os
import socket
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

import torch

from scalertune._amp._check import AmpCheckWarning
from scalertune._amp._config import AmpConfig, DeepSpeedFp16Config
from scalertune._amp._engine import EngineStopped
from scalertune._amp._watch import caller_stacklevel
from scalertune._errors import UsageError
from scalertune._frameworks import _accelerate_private, _transformers_private
from scalertune._frameworks import _deepspeed_private as private
from scalertune._inrun._lines import LOGGER

#: The ZeRO stages a search trains in. Stage 0 (DeepSpeed's FP16_Optimizer) keeps its scale
#: elsewhere and has no hysteresis; stage 3 partitions the parameters themselves, where a
#: run's gradient trace and its checkpoints read each one whole.
ZERO_STAGES = (1, 2)


def stage_of(config: Mapping[str, Any]) -> int:
    """The ZeRO stage a DeepSpeed config asks for (0 without ``zero_optimization``)."""
    zero = config.get("zero_optimization") or {}
    stage = zero.get("stage", 0) if isinstance(zero, Mapping) else 0
    return int(stage) if isinstance(stage, int) and not isinstance(stage, bool) else -1


def check_config(config: Any, *, what: str = "the DeepSpeed config", trainer: Any = None) -> None:
    """Refuse, in one line, a DeepSpeed release scalertune was not checked on (and the
    internals a ``trainer`` made with ``deepspeed=`` relies on, where one is given), or a
    DeepSpeed config it cannot train in."""
    private.check()
    if trainer is not None:
        _transformers_private.check(trainer)
        _transformers_private.check_deepspeed(trainer)
    if not isinstance(config, Mapping):
        raise UsageError(
            f"{what} is a {type(config).__name__}: give the config dict (or the path of "
            "ds_config.json) that deepspeed.initialize takes"
        )
    if _enabled(config.get("fp16")) and _enabled(config.get("bf16") or config.get("bfloat16")):
        refuse_deepspeed(what, "fp16-and-bf16")
    stage = stage_of(config)
    if stage == 3:
        refuse_deepspeed(what, "zero-3")
    if stage not in ZERO_STAGES:
        refuse_deepspeed(what, "no-zero", stage=stage)


#: The DeepSpeed forms scalertune does not train, each the one line that refuses it: what was
#: given (``{what}``), why, and what to do instead. ``trainer`` is an Accelerator or a
#: Lightning Trainer running DeepSpeed (a Hugging Face Trainer made with ``deepspeed=`` is
#: searched and attached as it is).
REFUSED = {
    "trainer": (
        "{what} runs DeepSpeed, whose fp16 mode has its own loss scaler: return the "
        "DeepSpeed config from the factory instead ({{'deepspeed': config, 'model': ..., "
        "'batches': ..., 'loss_fn': ...}}), which scalertune searches in DeepSpeed's engine, "
        "or take an fp16 block from scalertune export --to deepspeed"
    ),
    "fp16-and-bf16": (
        "{what} enables both fp16 and bf16, which DeepSpeed refuses: enable one (a "
        "search tries float16 under fp16's loss scaler, bfloat16 and float32 itself)"
    ),
    "zero-3": (
        "{what} trains with ZeRO stage 3, which partitions the parameters themselves: "
        "scalertune searches stages 1 and 2 (the same loss scaler and numerics); search "
        'with "zero_optimization": {{"stage": 2}} and train at stage 3 with the answer'
    ),
    "no-zero": (
        "{what} trains without ZeRO (zero_optimization stage {stage}): scalertune "
        "searches ZeRO stages 1 and 2, whose loss scaler has hysteresis; add "
        '"zero_optimization": {{"stage": 1}} (the same numerics, optimizer states '
        "partitioned)"
    ),
    "initialized": (
        "{what} was made by deepspeed.initialize already: return the model and optimizer "
        "before it (each run makes its own engine, with the run's precision)"
    ),
    "trained": "{what}'s DeepSpeed engine is made already (train() ran): {todo}",
    "gradscaler-answer": (
        "{what} is GradScaler's, searched outside DeepSpeed, and the Trainer trains in "
        "DeepSpeed's engine under its own scaler: search the DeepSpeed Trainer itself "
        "(return it from the factory), or take DeepSpeed's nearest fp16 block from "
        "scalertune export --to deepspeed"
    ),
    "in-run-check": (
        "{what} has an in-run check, which a DeepSpeed Trainer leaves out: DeepSpeed's "
        "engine casts the model itself to float16 and keeps float32 master weights in its "
        "optimizer, so a float32 forward at the model's weights is no float32 check; build "
        "the runtime without one (check=None)"
    ),
    "load": (
        "{what} is DeepSpeed's fp16 block, which trains in DeepSpeed's engine: put it in "
        "your ds_config.json (scalertune export {path}{flag} --to deepspeed), or attach it to your "
        "DeepSpeed Trainer (scalertune.attach)"
    ),
    "diagnose": (
        "diagnose watches the model module by module under autocast, and {what} trains in "
        "DeepSpeed's engine, which casts the whole model: search it (scalertune search) for "
        "its fp16 block and what it does over the horizon"
    ),
}


#: The one line a DeepSpeed Trainer's ``attach`` says where an in-run check was asked for.
CHECK_LEFT_OUT = (
    "scalertune: the in-run check is left out of a DeepSpeed Trainer: DeepSpeed's engine "
    "casts the model itself to float16 and keeps float32 master weights in its optimizer, "
    "so a float32 forward at the model's weights is no float32 check (the watch still "
    "follows DeepSpeed's scaler, and DeepSpeed raises at min_loss_scale)"
)


def say_check_left_out() -> None:
    """:data:`CHECK_LEFT_OUT`, as an ``AmpCheckWarning`` pointed at the user's line, and in
    the ``scalertune`` log."""
    LOGGER.warning(CHECK_LEFT_OUT)
    warnings.warn(AmpCheckWarning(CHECK_LEFT_OUT), stacklevel=caller_stacklevel())


def refuse_deepspeed(what: str, form: str, **facts: Any) -> NoReturn:
    """The one refusal of a DeepSpeed form scalertune does not train (``form``, a key of
    :data:`REFUSED`): a :class:`UsageError` of one line naming ``what`` was given."""
    raise UsageError(REFUSED[form].format(what=what, **facts))


def engine_facts(config: Mapping[str, Any]) -> dict[str, Any]:
    """What a study keeps of the engine a DeepSpeed config makes: its ZeRO stage, whether
    DeepSpeed's accelerator runs bfloat16 on this device, and the config itself where it is
    plain JSON (the export writes the answer into it)."""
    from deepspeed.accelerator import get_accelerator

    facts = {
        "zero_stage": stage_of(config),
        "bfloat16": bool(get_accelerator().is_bf16_supported()),
    }
    # a config holding objects is left out: the export writes the answer's blocks alone
    with contextlib.suppress(TypeError, ValueError):
        facts["config"] = _finite(json.loads(json.dumps(config)))
    return facts


def _finite(value: Any) -> Any:
    """``value`` without the keys whose numbers are not finite (a Trainer's config says
    ``steps_per_print`` inf: not a number a YAML file holds)."""
    if isinstance(value, dict):
        return {
            k: _finite(v)
            for k, v in value.items()
            if not (isinstance(v, float) and not math.isfinite(v))
        }
    return value


def _enabled(block: Any) -> bool:
    return isinstance(block, Mapping) and block.get("enabled") is True


def engine_config(base: Mapping[str, Any], config: AmpConfig) -> dict[str, Any]:
    """The user's DeepSpeed config with ``config``'s precision in it: its ``fp16`` block for
    a DeepSpeed fp16 config (a plain float16 config, as the step timing runs, gets the
    nearest one), ``bf16`` enabled for bfloat16, neither for float32, and
    ``gradient_clipping`` (0: none; DeepSpeed clips at 1.0 where the key is absent)."""
    out = copy.deepcopy(dict(base))
    fp16 = out.get("fp16")
    kept = (
        {"auto_cast": fp16["auto_cast"]}
        if isinstance(fp16, Mapping) and "auto_cast" in fp16
        else {}
    )
    if config.dtype == "float16":
        out["fp16"] = {**kept, **as_deepspeed(config).fp16_block()}
    else:
        out["fp16"] = {"enabled": False}
    out["bf16"] = {"enabled": config.dtype == "bfloat16"}
    out.pop("bfloat16", None)
    out["gradient_clipping"] = config.clip_norm if config.clip_norm is not None else 0.0
    return out


def as_deepspeed(config: AmpConfig) -> DeepSpeedFp16Config:
    """``config`` as DeepSpeed's scaler: itself, or the nearest to a GradScaler config (each
    overflow backs off, as GradScaler's does)."""
    if isinstance(config, DeepSpeedFp16Config):
        return config
    power = max(round(torch.tensor(config.init_scale).log2().item()), 0)
    return DeepSpeedFp16Config(
        init_scale=float(2**power),
        growth_interval=config.growth_interval,
        hysteresis=1,
        clip_norm=config.clip_norm,
    )


def dtype_of(config: AmpConfig) -> torch.dtype:
    """The dtype DeepSpeed casts the model to under ``config``."""
    return getattr(torch, config.dtype)


def process_group() -> None:
    """A process group for DeepSpeed's engine: the one a launcher (or the search's ranks)
    started, else one of a single process, on a free port of this host, as a launcher would
    describe it (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``); DeepSpeed's shared-memory all-reduce left unbuilt (see the module's
    docstring)."""
    import deepspeed

    private.leave_shared_memory_unbuilt()
    if not torch.distributed.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for key, value in (
            ("RANK", "0"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", str(port)),
        ):
            os.environ.setdefault(key, value)
    # DeepSpeed asks a launcher's LOCAL_RANK of an engine made with arguments (Accelerate's)
    os.environ.setdefault("LOCAL_RANK", str(int(os.environ.get("RANK", "0"))))
    # its collectives call torch's deprecated names: a warning per rank and run, not the user's
    warnings.filterwarnings("ignore", _DEPRECATED_COLLECTIVES, FutureWarning)
    # the launcher's environment set here makes Accelerate see a distributed CPU run, and warn
    # at each Trainer a search makes that it set the threads (the search sets them itself)
    warnings.filterwarnings("ignore", _ACCELERATE_THREADS, UserWarning)
    with quiet(), contextlib.redirect_stdout(io.StringIO()):  # "... built successfully"
        deepspeed.init_distributed(auto_mpi_discovery=False, verbose=False)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """DeepSpeed's info lines off while it makes a group or an engine (it greets each);
    its warnings stay."""
    from deepspeed.utils import logger

    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def quiet_overflows() -> None:
    """DeepSpeed's info lines off for good in this process: a search trains many engines,
    and DeepSpeed logs every overflow of each (a step's own switch would cost more than the
    step: a logger's level clears every logger's cache). Only a search's processes call it."""
    from deepspeed.utils import logger

    logger.setLevel(max(logger.level, logging.WARNING))


def initialize(model: torch.nn.Module, optimizer: Any, config: Mapping[str, Any]) -> Any:
    """A DeepSpeed engine for ``model`` (with ``optimizer``, or the one ``config`` names)."""
    import deepspeed

    private.allow_float16()
    process_group()
    parameters = [p for p in model.parameters() if p.requires_grad]
    with quiet():
        engine, *_ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            model_parameters=parameters if optimizer is None else None,
            config=dict(config),
        )
    return engine


#: torch's warning on the deprecated collectives DeepSpeed's ZeRO calls.
_DEPRECATED_COLLECTIVES = r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)`"
#: Accelerate's warning at a Trainer made in a distributed CPU run without OMP_NUM_THREADS.
_ACCELERATE_THREADS = r"OMP_NUM_THREADS/MKL_NUM_THREADS unset"


class DeepSpeedRun:
    """One DeepSpeed engine bound to a runtime (:class:`scalertune._amp._engine.Engine`)."""

    def __init__(self, engine: Any, source: Any = None) -> None:
        self.engine, self.source = engine, source
        #: The runtime of the run's current step (a Trainer's backward reads it), and whether
        #: its optimizer step was applied.
        self.amp: Any = None
        self.applied = False
        self._exposed: list[torch.nn.Parameter] = []
        self._open = False  # a backward not followed by a step yet

    def backward(self, loss: torch.Tensor, *, gradients: bool, **kwargs: Any) -> None:
        if self._open:  # the last backward had no step (the start-up probe's): not summed
            self.zero_grad()
        self._open = True
        self.engine.backward(loss, **kwargs)
        if gradients:
            self._expose()

    def zero_grad(self) -> None:
        """The gradients of a backward that no step took, gone (the exposed ones first:
        ZeRO's own ``zero_grad`` takes every ``.grad`` for its own)."""
        self._hide()
        self._open = False
        self.engine.optimizer.zero_grad(set_to_none=True)

    def micro_step(self) -> None:
        """``engine.step()`` after a micro-batch that ends no optimizer step."""
        self._hide()
        self._open = False
        self.engine.step()

    def step(self) -> bool:
        self._hide()
        self._open = False
        try:
            self.engine.step()
        except Exception as exc:
            if not private.at_minimum(exc):
                raise
            raise EngineStopped(
                f"DeepSpeed raised at its minimum loss scale ({self.scale():g}): an overflow "
                "came with the scale at min_loss_scale, which ends training under ZeRO"
            ) from None
        return bool(self.engine.was_step_applied())

    def scale(self) -> float:
        return private.scale(self.engine)

    def scaler_state(self) -> dict[str, Any]:
        return private.scaler_state(self.engine)

    def load_scaler_state(self, state: Mapping[str, Any]) -> None:
        private.load_scaler_state(self.engine, state)

    def _expose(self) -> None:
        """Each parameter's whole gradient in its ``.grad``, unscaled, where ZeRO keeps it
        partitioned and away from the parameter (a gradient trace reads ``.grad``)."""
        from deepspeed.utils import safe_get_full_grad

        scale = self.scale()
        for p in self.engine.module.parameters():
            if p.requires_grad and p.grad is None:
                full = safe_get_full_grad(p)
                if full is not None:
                    p.grad = (full / scale).to(p.dtype).view(p.shape)
                    self._exposed.append(p)

    def _hide(self) -> None:
        """The exposed gradients gone again before the engine steps (ZeRO owns its own)."""
        for p in self._exposed:
            p.grad = None
        self._exposed = []


def full_state(engine: Any) -> dict[str, Any]:
    """The engine's optimizer as a plain optimizer's whole state, per parameter in the
    module's order: its float32 master weight and each state tensor, and the step count;
    readable whatever the ZeRO stage and the number of ranks."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    params = [p for p in engine.module.parameters() if p.requires_grad]
    base = private.base_optimizer(engine)
    first: dict[str, Any] = next(iter(base.state.values()), {})
    keys = [k for k, v in first.items() if isinstance(v, torch.Tensor) and v.dim() > 0]
    scalars = {k: v for k, v in first.items() if k not in keys}
    scheduler = getattr(engine, "lr_scheduler", None)
    return {
        "master": [safe_get_full_fp32_param(p).detach().cpu() for p in params],
        "state": {
            k: [safe_get_full_optimizer_state(p, k).detach().cpu() for p in params] for k in keys
        },
        "scalars": scalars,
        "lr": [group.get("lr") for group in engine.optimizer.param_groups],
        "scheduler": None if scheduler is None else scheduler.state_dict(),
    }


def load_full_state(engine: Any, saved: Mapping[str, Any]) -> None:
    """Put ``engine``'s optimizer in the state :func:`full_state` read (from any precision:
    a float32 reference's state starts a float16 branch with exact master weights)."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    params = [p for p in engine.module.parameters() if p.requires_grad]
    if saved["state"] and not private.base_optimizer(engine).state:
        _prime(engine, params)
    for p, master in zip(params, saved["master"]):
        safe_set_full_fp32_param(p, master.to(p.device))
    for key, values in saved["state"].items():
        for p, value in zip(params, values):
            safe_set_full_optimizer_state(p, value.to(p.device), key)
    for state in private.base_optimizer(engine).state.values():
        for key, value in saved["scalars"].items():
            state[key] = value.clone() if isinstance(value, torch.Tensor) else value
    for group, lr in zip(engine.optimizer.param_groups, saved["lr"]):
        if lr is not None:
            group["lr"] = lr
    scheduler = getattr(engine, "lr_scheduler", None)
    if scheduler is not None and saved.get("scheduler") is not None:
        scheduler.load_state_dict(saved["scheduler"])


def _prime(engine: Any, params: list[torch.nn.Parameter]) -> None:
    """One optimizer step of zero gradients at a learning rate of 0: the optimizer makes its
    state (lazily, at its first step, as torch's optimizers do), for a checkpoint's to be
    written into; the weights stay as they are."""
    groups = engine.optimizer.param_groups
    rates = [group["lr"] for group in groups]
    for group in groups:
        group["lr"] = 0.0
    try:
        for _ in range(engine.gradient_accumulation_steps()):  # the last is the boundary
            # a float32 loss: the scale seeding a float16 one's backward may be inf there
            engine.backward(sum((p.float() * 0).sum() for p in params))
            engine.step()
    finally:
        for group, rate in zip(groups, rates):
            group["lr"] = rate


# -- a Hugging Face Trainer made with deepspeed= ------------------------------------------------


def is_deepspeed_trainer(trainer: Any) -> bool:
    """Whether a Hugging Face Trainer trains in DeepSpeed (``deepspeed=`` in its arguments)."""
    return bool(getattr(trainer, "is_deepspeed_enabled", False))


def trainer_config(trainer: Any) -> dict[str, Any]:
    """The DeepSpeed config a Trainer makes its engine from (its ``auto`` values filled from
    the ``TrainingArguments``, as far as they are known before ``train()``)."""
    return _accelerate_private.deepspeed_config(trainer.accelerator)


def trainer_engine(trainer: Any) -> Any:
    """The engine ``trainer``'s ``train()`` made (``None`` before)."""
    return _accelerate_private.deepspeed_engine(trainer.accelerator)


def replace_trainer_backward(trainer: Any, backward: Any) -> None:
    """``backward`` in place of the Trainer's Accelerator's: the backward (and, where the
    gradients sync, the step) that ``training_step`` takes."""
    _accelerate_private.replace_backward(trainer.accelerator, backward)


def set_trainer_precision(trainer: Any, config: Mapping[str, Any]) -> None:
    """Make ``trainer``'s engine from ``config`` (a run's precision in the Trainer's own
    DeepSpeed config), casting floating inputs to its dtype as ``train()`` does."""
    kept = trainer_config(trainer)
    kept.clear()
    kept.update(copy.deepcopy(dict(config)))
    bf16 = bool((config.get("bf16") or {}).get("enabled"))
    fp16 = bool((config.get("fp16") or {}).get("enabled"))
    dtype = torch.bfloat16 if bf16 else torch.float16 if fp16 else torch.float32
    _transformers_private.set_input_dtype(trainer, dtype)
    trainer.args.fp16, trainer.args.bf16 = fp16, bf16


def init_trainer_engine(trainer: Any, max_steps: int) -> Any:
    """The engine ``trainer``'s ``train()`` would make, made now as ``train()`` makes it
    (``deepspeed_init``, then ``accelerator.prepare``, then the Trainer's scheduler)."""
    private.allow_float16()
    process_group()
    quiet_overflows()
    optimizer, scheduler = _transformers_private.deepspeed_init(trainer, max_steps)
    accelerator = trainer.accelerator
    if _accelerate_private.is_config_scheduler(scheduler):
        model, trainer.optimizer, trainer.lr_scheduler = accelerator.prepare(
            trainer.model, optimizer, scheduler
        )
    else:
        model, trainer.optimizer = accelerator.prepare(trainer.model, optimizer)
    trainer.create_scheduler(num_training_steps=max_steps)
    _transformers_private.set_engine(trainer, model)
    return model


def trainer_backward(trainer: Any, run: DeepSpeedRun, loss: torch.Tensor, **kwargs: Any) -> None:
    """Accelerate's DeepSpeed backward (``engine.backward``, then ``engine.step`` where the
    gradients sync) through the run's runtime, which counts and checks the step."""
    kwargs.pop("learning_rate", None)  # LOMO's
    last = trainer.accelerator.sync_gradients
    run.engine.set_gradient_accumulation_boundary(is_boundary=last)
    run.amp.backward(loss, **kwargs)
    if last:
        run.applied = bool(run.amp.step(trainer.optimizer))
    else:
        run.micro_step()


def attach_trainer(trainer: Any, amp: Any) -> None:
    """Train ``trainer`` (made with ``deepspeed=``) under ``amp``'s config: its precision in
    the Trainer's DeepSpeed config before ``train()`` makes the engine (the ``fp16`` block
    the search tried, ``bf16``, ``gradient_clipping``), float16 allowed on a CPU, and the
    engine ``train()`` makes bound to ``amp`` at its first backward, so that ``amp`` counts
    and watches the steps DeepSpeed takes."""
    if trainer_engine(trainer) is not None:
        refuse_deepspeed("this Trainer", "trained", todo="attach to a new Trainer, before train()")
    config = amp.config
    if config.dtype == "float16" and not isinstance(config, DeepSpeedFp16Config):
        refuse_deepspeed("this answer", "gradscaler-answer")
    if amp.check is not None:
        refuse_deepspeed("this runtime", "in-run-check")
    current = trainer_config(trainer)
    check_config(current, what="the Trainer's DeepSpeed config", trainer=trainer)
    set_trainer_precision(trainer, engine_config(current, config))
    trainer.args.max_grad_norm = config.clip_norm or 0.0  # DeepSpeed clips: the config says
    private.allow_float16()
    run = DeepSpeedRun(None, source=trainer)
    run.amp = amp
    replace_trainer_backward(trainer, functools.partial(_attached_backward, trainer, run))


def _attached_backward(trainer: Any, run: DeepSpeedRun, loss: torch.Tensor, **kwargs: Any) -> None:
    if run.engine is None:  # the engine train() made: bound at its first backward
        run.engine = trainer_engine(trainer)
        run.amp.bind(run)
    trainer_backward(trainer, run, loss, **kwargs)
