"""A training engine that scales the loss, clips and steps the optimizer itself, under a runtime.

DeepSpeed's engine keeps mixed precision to itself: its fp16 mode casts the model to float16,
scales the loss in ``engine.backward`` with its own dynamic loss scaler, and in
``engine.step`` unscales, checks for an overflow, clips and steps (or skips) the optimizer
it wraps. A runtime that such an engine is bound to (:meth:`~scalertune.AmpRuntime.bind`)
hands it its ``backward`` and its ``step``, and reads back what the engine decided: whether
the step was skipped, and the scale. The runtime's skipped steps, the guard and the watch are
then the engine's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from scalertune._errors import UsageError


class EngineStopped(Exception):
    """The engine ended the training itself (DeepSpeed's scaler, at its ``min_loss_scale``,
    met another overflow); the message says why, in one line."""


class Engine(Protocol):
    """What a runtime needs of an engine that scales and steps itself."""

    def backward(self, loss: torch.Tensor, *, gradients: bool, **kwargs: Any) -> None:
        """The engine's backward of ``loss`` (scaled by the engine's own scaler). With
        ``gradients``, every parameter's ``.grad`` holds its whole gradient afterwards, until
        :meth:`step` (a gradient trace reads them there; ZeRO keeps them elsewhere)."""

    def step(self) -> bool:
        """The engine's optimizer step; whether it was applied (``False``: skipped on an
        overflow)."""

    def scale(self) -> float:
        """The loss scale the next backward uses (1.0 without a scaler)."""

    def scaler_state(self) -> dict[str, Any]:
        """The scaler's state, for a checkpoint."""

    def load_scaler_state(self, state: Mapping[str, Any]) -> None:
        """Put the scaler in ``state`` (a checkpoint's, or where a branch's replay puts it)."""


class EngineSlot:
    """The engine a runtime trains through, if one is bound; for a config only an engine
    trains (DeepSpeed's fp16), the scaler state kept for the engine until it is bound."""

    def __init__(self, *, needed: bool) -> None:
        self.needed = needed
        self.engine: Engine | None = None
        self._state: dict[str, Any] | None = None

    @property
    def active(self) -> bool:
        """Whether backward, the scale and the scaler's state are the engine's."""
        return self.needed or self.engine is not None

    def bind(self, engine: Engine) -> None:
        if engine is self.engine:
            return
        self.engine = engine
        if self._state is not None:
            engine.load_scaler_state(self._state)
            self._state = None

    def backward(self, loss: torch.Tensor, *, gradients: bool, **kwargs: Any) -> None:
        if self.engine is None:
            raise UsageError(
                "a DeepSpeed fp16 config trains inside DeepSpeed's engine, under its own "
                "loss scaler: export it into your ds_config.json (scalertune export --to "
                "deepspeed), or attach it to a DeepSpeed Trainer"
            )
        self.engine.backward(loss, gradients=gradients, **kwargs)

    def state(self) -> dict[str, Any]:
        return self.engine.scaler_state() if self.engine is not None else dict(self._state or {})

    def load(self, state: Mapping[str, Any]) -> None:
        if self.engine is not None:
            self.engine.load_scaler_state(state)
        else:
            self._state = dict(state)
