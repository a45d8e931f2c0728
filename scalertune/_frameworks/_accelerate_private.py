"""Accelerate's internals, in one place: what scalertune relies on that Accelerate does not
make public, and the methods it replaces.

No other module of the package names a private part of Accelerate; each entry below is
checked against the installed Accelerate by ``tests/unit/test_frameworks_private.py``, and
``pyproject.toml`` bounds accelerate to the releases those tests passed on (:data:`RELEASES`,
checked again by :func:`check` when an Accelerator is handed over). What is relied on:

- whether ``prepare()`` has run: the lists of what the Accelerator prepared (``_models``,
  ``_optimizers``); the prepared optimizers are also what ``unscale_gradients()`` without an
  argument unscales (:func:`prepared_optimizers`);
- a prepared optimizer's verdict on its last step, ``AcceleratedOptimizer._is_overflow``,
  which its ``step_was_skipped`` (and the Accelerator's ``optimizer_step_was_skipped``, by
  which a Hugging Face Trainer holds its LR scheduler) reads: written with the runtime's
  verdict (:func:`set_step_skipped`);
- whether the gradients sync after a micro-batch, ``GradientState._set_sync_gradients``, set
  as a Hugging Face Trainer's ``train()`` sets it (:func:`set_sync_gradients`);
- Accelerate's own float8 (``mixed_precision="fp8"``, from the Accelerator's arguments or
  ``accelerate launch``): ``prepare`` reads ``fp8_backend`` (the handlers the Accelerator
  made, else ``ACCELERATE_FP8_BACKEND``) and converts the model's Linear layers itself
  (torchao) or wraps its forward (Transformer Engine). The handlers are set aside
  (:data:`FP8_SET`, :func:`leave_out_fp8`), so that the runtime's config is the precision
  (:func:`fp8_backend` says what is left);
- the instance attributes that ``_accelerate.route_accelerator`` replaces on one Accelerator
  (:data:`REPLACED`: four methods and two attributes), and the method it replaces on each
  optimizer ``prepare_optimizer`` returns (:data:`OPTIMIZER_REPLACED`);
- an Accelerator running DeepSpeed (a Hugging Face Trainer's, made with ``deepspeed=``):
  its ``state.deepspeed_plugin`` (:func:`deepspeed_plugin`) and that plugin's
  ``deepspeed_config``, the one dict ``prepare`` makes the engine from (a run's precision
  goes in there, :func:`deepspeed_config`); ``deepspeed_engine_wrapped``, the engine
  ``prepare`` made (:func:`deepspeed_engine`); ``accelerate.utils.DummyScheduler``, what
  stands for a scheduler the DeepSpeed config names, made with the engine
  (:func:`is_config_scheduler`); and its ``backward`` replaced (:data:`DEEPSPEED_REPLACED`,
  :func:`replace_backward`): the Trainer's ``training_step`` calls it, and under DeepSpeed it
  runs ``engine.backward`` and, where the gradients sync, ``engine.step``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from scalertune._frameworks._releases import Releases, has_path, importable

RELEASES = Releases("accelerate", (0, 30), (1, 17), checked="1.16")

#: What ``route_accelerator`` sets on an Accelerator: the methods Accelerate itself calls
#: (``backward``, ``prepare_model``, ``prepare_optimizer``, ``unscale_gradients``, the last
#: by ``clip_grad_norm_``), its autocast switch and its GradScaler.
REPLACED = (
    "backward",
    "prepare_model",
    "prepare_optimizer",
    "unscale_gradients",
    "native_amp",
    "scaler",
)
#: What is set on each prepared optimizer: its ``step`` (so that an LR scheduler wraps it).
OPTIMIZER_REPLACED = ("step",)

#: What ``route_accelerator`` sets on an Accelerator so that its ``prepare`` leaves float8 to
#: the runtime (:func:`leave_out_fp8`).
FP8_SET = ("has_fp8_handler", "ao_recipe_handler", "te_recipe_handler", "fp8_enabled")
#: What ``fp8_backend`` falls back to without handlers.
FP8_BACKEND_VARIABLE = "ACCELERATE_FP8_BACKEND"

#: What is replaced on an Accelerator running DeepSpeed (a DeepSpeed Trainer's).
DEEPSPEED_REPLACED = ("backward",)
#: What is read of an Accelerator running DeepSpeed: where its plugin is, the engine
#: ``prepare`` made, and the plugin's config.
DEEPSPEED_READ = ("state.deepspeed_plugin", "deepspeed_engine_wrapped")
#: What ``prepare`` makes a DeepSpeed engine's scheduler from: (module, name).
DUMMY_SCHEDULER = ("accelerate.utils", "DummyScheduler")

#: The private names of an Accelerator read or called.
_PRIVATE = ("_models", "_optimizers")


def check(accelerator: Any) -> None:
    """Refuse, in one line, an Accelerate release outside the bound, or one without a name
    listed here."""
    RELEASES.check()
    missing = [n for n in (*REPLACED, *_PRIVATE) if not hasattr(accelerator, n)]
    if not hasattr(getattr(accelerator, "gradient_state", None), "_set_sync_gradients"):
        missing.append("GradientState._set_sync_gradients")
    if fp8_backend(accelerator) != "NO":  # its own float8, set aside by leave_out_fp8
        missing += [n for n in FP8_SET if not hasattr(accelerator, n)]
    if missing:
        raise RELEASES.missing(missing)


def check_deepspeed(accelerator: Any) -> None:
    """Refuse, in one line, an Accelerate release outside the bound, or one whose
    Accelerator running DeepSpeed lacks a name listed here (:data:`DEEPSPEED_READ`, the
    plugin's config, :data:`DUMMY_SCHEDULER`)."""
    RELEASES.check()
    missing = [n for n in DEEPSPEED_READ if not has_path(accelerator, n)]
    plugin = deepspeed_plugin(accelerator) if not missing else None
    if plugin is not None and not hasattr(plugin, "deepspeed_config"):
        missing.append("DeepSpeedPlugin.deepspeed_config")
    if not importable(*DUMMY_SCHEDULER):
        missing.append(".".join(DUMMY_SCHEDULER))
    if missing:
        raise RELEASES.missing(missing)


def prepared_anything(accelerator: Any) -> bool:
    """Whether ``accelerator.prepare`` has made a model or an optimizer already."""
    return bool(accelerator._models or accelerator._optimizers)  # noqa: SLF001


def prepared_optimizers(accelerator: Any) -> list[Any]:
    """The optimizers ``accelerator.prepare`` made, in order."""
    return list(accelerator._optimizers)  # noqa: SLF001


def set_step_skipped(optimizer: Any, skipped: bool) -> None:
    """Set what a prepared optimizer's ``step_was_skipped`` reads."""
    optimizer._is_overflow = skipped  # noqa: SLF001


def set_sync_gradients(accelerator: Any, sync: bool) -> None:
    """Tell ``accelerator`` whether the gradients sync after this micro-batch."""
    accelerator.gradient_state._set_sync_gradients(sync)  # noqa: SLF001


def fp8_backend(accelerator: Any | None) -> str:
    """The float8 backend ``accelerator.prepare`` converts the model with: ``"AO"``
    (torchao), ``"TE"`` (Transformer Engine), or ``"NO"``; with ``None``, the one it falls back
    to without float8 handlers (``ACCELERATE_FP8_BACKEND``)."""
    if accelerator is None:
        return os.environ.get(FP8_BACKEND_VARIABLE, "NO").upper()
    backend = getattr(accelerator, "fp8_backend", "NO")
    return str(getattr(backend, "value", backend))


def leave_out_fp8(accelerator: Any) -> None:
    """Set aside the float8 handlers ``accelerator`` was made with (:data:`FP8_SET`): its
    ``prepare`` then converts no layer and wraps no forward, unless ``ACCELERATE_FP8_BACKEND``
    still names a backend (:func:`fp8_backend` reads it)."""
    accelerator.has_fp8_handler = False
    accelerator.ao_recipe_handler = accelerator.te_recipe_handler = None
    accelerator.fp8_enabled = False


# -- an Accelerator running DeepSpeed -------------------------------------------------------


def deepspeed_plugin(accelerator: Any) -> Any:
    """The DeepSpeed plugin of ``accelerator`` (``None`` where it runs no DeepSpeed)."""
    return accelerator.state.deepspeed_plugin


def deepspeed_config(accelerator: Any) -> dict[str, Any]:
    """The DeepSpeed config ``accelerator.prepare`` makes the engine from: one dict, what is
    set in it is what the engine is made from."""
    config: dict[str, Any] = deepspeed_plugin(accelerator).deepspeed_config
    return config


def deepspeed_engine(accelerator: Any) -> Any:
    """The DeepSpeed engine ``accelerator.prepare`` made (``None`` before)."""
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    return None if wrapped is None else wrapped.engine


def is_config_scheduler(scheduler: Any) -> bool:
    """Whether ``scheduler`` stands for one the DeepSpeed config names, which
    ``accelerator.prepare`` makes with the engine."""
    from accelerate.utils import DummyScheduler

    return isinstance(scheduler, DummyScheduler)


def replace_backward(accelerator: Any, backward: Callable[..., None]) -> None:
    """``backward`` in place of the Accelerator's (:data:`DEEPSPEED_REPLACED`)."""
    accelerator.backward = backward
