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
- the instance attributes that ``_accelerate.route_accelerator`` replaces on one Accelerator
  (:data:`REPLACED`: four methods and two attributes), and the method it replaces on each
  optimizer ``prepare_optimizer`` returns (:data:`OPTIMIZER_REPLACED`).
"""

from __future__ import annotations

from typing import Any

from scalertune._frameworks._releases import Releases

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

#: The private names of an Accelerator read or called.
_PRIVATE = ("_models", "_optimizers")


def check(accelerator: Any) -> None:
    """Refuse, in one line, an Accelerate release outside the bound, or one without a name
    listed here."""
    RELEASES.check()
    missing = [n for n in (*REPLACED, *_PRIVATE) if not hasattr(accelerator, n)]
    if not hasattr(getattr(accelerator, "gradient_state", None), "_set_sync_gradients"):
        missing.append("GradientState._set_sync_gradients")
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
