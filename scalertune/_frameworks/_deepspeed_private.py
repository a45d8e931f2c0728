"""DeepSpeed's internals, in one place: what scalertune relies on of DeepSpeed that DeepSpeed
does not document, and what it replaces.

The documented API does most of the work (``deepspeed.initialize``, ``engine.backward``,
``engine.step``, ``engine.was_step_applied``, ``engine.destroy``, and the
``deepspeed.utils.safe_get_full_*``/``safe_set_full_*`` functions that read and write a
parameter's whole gradient, master weight and optimizer state under ZeRO). No other module
of the package names a private part of DeepSpeed; each entry below is checked against the
installed release by ``tests/unit/test_frameworks_private.py``, and ``pyproject.toml``
bounds deepspeed to the releases those tests passed on (:data:`RELEASES`, checked again by
:func:`check` when a DeepSpeed workload or a DeepSpeed Trainer is handed over). A Hugging
Face Trainer made with ``deepspeed=`` relies on internals of Accelerate and transformers too:
those are listed in ``_accelerate_private`` and ``_transformers_private``. What is relied on:

- the accelerator's ``is_fp16_supported``, replaced on DeepSpeed's CPU accelerator object
  (:func:`allow_float16`): it says no where oneDNN has no native float16 matmul, and the
  engine then refuses fp16; torch trains float16 there all the same (slowly, as every
  float16 trial on a CPU does);
- ``deepspeed.ops.__compatible_ops__``, the ops DeepSpeed may build: its shared-memory
  all-reduce for CPUs (:data:`SHARED_MEMORY_OP`) marked unbuildable in a search's processes
  (:func:`leave_shared_memory_unbuilt`): a group of one has nothing to reduce, and a
  search's ranks all-reduce through gloo, instead of compiling it on the first search of a
  machine (a minute of a CPU, for runs of a few seconds);
- ZeRO's loss scaler, ``engine.optimizer.loss_scaler`` (``DynamicLossScaler``), and its
  :data:`SCALER_FIELDS` (``cur_scale``, ``cur_hysteresis``, ``last_overflow_iter``,
  ``cur_iter``, by names of scalertune's own): the scale read after every step, the state a
  checkpoint keeps, and where a branch's replay puts it (:func:`scale`,
  :func:`scaler_state`, :func:`load_scaler_state`);
- ZeRO's base optimizer, ``engine.optimizer.optimizer`` (:func:`base_optimizer`), whose
  per-partition ``state`` holds the optimizer's step count (``safe_get_full_optimizer_state``
  reaches its tensors only);
- the first words of ``DynamicLossScaler``'s error at its minimum (:data:`AT_MINIMUM`),
  which tell it from any other error of a step (:func:`at_minimum`);
- what ``deepspeed.initialize`` leaves on what it made (:func:`made_by_initialize`): its
  classes' names, and the ``ds_id`` (ZeRO-3) or ``_hp_mapping`` (ZeRO 1-2) it sets on each
  parameter.

DeepSpeed is imported where it is used: it is no dependency of scalertune.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from scalertune._frameworks._releases import Releases, importable

# to the patch release the tests ran on: a later 0.19 release changes how hysteresis counts
# without ZeRO (DeepSpeed's newer tests expect it), which the replay would then not match
RELEASES = Releases("deepspeed", (0, 19), (0, 19, 9), checked="0.19.8")

#: DeepSpeed's shared-memory all-reduce for CPUs, built on first use unless marked unbuildable.
SHARED_MEMORY_OP = "deepspeed_shm_comm"
#: ``DynamicLossScaler``'s state, by the names a runtime's scaler state gives it: what a
#: checkpoint keeps and a branch sets.
SCALER_FIELDS = {
    "scale": "cur_scale",
    "hysteresis": "cur_hysteresis",
    "last_overflow": "last_overflow_iter",
    "iteration": "cur_iter",
}
#: The start of the message ``DynamicLossScaler.update_scale`` raises with when an overflow
#: comes with the scale at ``min_loss_scale`` (``raise_error_at_min_scale``, on under ZeRO).
AT_MINIMUM = "Current loss scale already at minimum"

#: The names checked to be there when a DeepSpeed workload is handed over: (module,
#: attribute path), each imported only then.
_MODULE_NAMES = (
    ("deepspeed.ops", "__compatible_ops__"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler.update_scale"),
    ("deepspeed.runtime.zero.stage_1_and_2", "DeepSpeedZeroOptimizer"),
    ("deepspeed.accelerator", "get_accelerator"),
)


def check() -> None:
    """Refuse, in one line, a DeepSpeed release outside the bound, or one without a name
    listed here."""
    RELEASES.check()
    missing = [f"{module}.{path}" for module, path in _MODULE_NAMES if not importable(module, path)]
    if missing:
        raise RELEASES.missing(missing)


# -- DeepSpeed's engine ---------------------------------------------------------------------


def allow_float16() -> None:
    """Have DeepSpeed's CPU accelerator train fp16 where it would refuse (see the module's
    docstring); nothing elsewhere."""
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() == "cpu" and not accelerator.is_fp16_supported():
        accelerator.is_fp16_supported = lambda: True


def leave_shared_memory_unbuilt() -> None:
    """DeepSpeed's shared-memory all-reduce marked unbuildable: gloo's all-reduce instead."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHARED_MEMORY_OP] = False


def loss_scaler(engine: Any) -> Any:
    """ZeRO's loss scaler of ``engine`` (a ``DynamicLossScaler`` under fp16, a static one of
    scale 1 otherwise)."""
    return engine.optimizer.loss_scaler


def scale(engine: Any) -> float:
    """The loss scale ``engine``'s next backward uses."""
    return float(loss_scaler(engine).cur_scale)


def scaler_state(engine: Any) -> dict[str, Any]:
    """The loss scaler's state, keyed as :data:`SCALER_FIELDS` (a static scaler has only
    its scale)."""
    scaler = loss_scaler(engine)
    state = {k: getattr(scaler, f) for k, f in SCALER_FIELDS.items() if hasattr(scaler, f)}
    return {**state, "scale": float(scaler.cur_scale)}


def load_scaler_state(engine: Any, state: Mapping[str, Any]) -> None:
    """Put the loss scaler in ``state`` (keyed as :data:`SCALER_FIELDS`, those it holds)."""
    scaler = loss_scaler(engine)
    for key, field in SCALER_FIELDS.items():
        if key in state and hasattr(scaler, field):
            setattr(scaler, field, state[key])


def base_optimizer(engine: Any) -> Any:
    """The optimizer ZeRO wraps (``torch.optim.Adam``, or the one the config names), over
    flat partitions of the parameters."""
    return engine.optimizer.optimizer


def at_minimum(error: BaseException) -> bool:
    """Whether ``error`` is ``DynamicLossScaler``'s at its minimum scale."""
    return str(error).startswith(AT_MINIMUM)


def made_by_initialize(value: Any) -> bool:
    """Whether ``value`` (a factory's model or optimizer) was made, or taken, by
    ``deepspeed.initialize`` already."""
    if type(value).__name__ in ("DeepSpeedEngine", "DeepSpeedZeroOptimizer"):
        return True
    return isinstance(value, torch.nn.Module) and any(
        hasattr(p, "ds_id") or hasattr(p, "_hp_mapping") for p in value.parameters()
    )
