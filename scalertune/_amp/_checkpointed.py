"""What a runtime keeps in a training checkpoint, and how it is restored: the scaler's state
and the counters and, with an in-run check, the config the check trains with now and its
record, so that a resumed run keeps what the check did."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from scalertune._amp._check import RunCheck
from scalertune._amp._config import AmpConfig
from scalertune._amp._engine import EngineSlot
from scalertune._amp._scaler import Skips


class Checkpointed:
    """:meth:`state_dict` and :meth:`load_state_dict` of :class:`~scalertune.AmpRuntime`."""

    config: AmpConfig
    scaler: torch.amp.GradScaler
    check: RunCheck | None
    steps: int
    _skips: Skips
    _engine: EngineSlot
    reconfigure: Callable[[AmpConfig], None]

    def state_dict(self) -> dict[str, Any]:
        """The runtime's state for a training checkpoint.

        Returns:
            The scaler's state (``{}`` for a disabled scaler; the loss scaler's of a bound
            DeepSpeed engine), the step and skipped-step counts and, with an in-run check, the
            config it trains with now (islands added, knobs changed, float32) and the check's
            record. Save it beside the model's and the optimizer's.

        Example:
            >>> import scalertune
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=1024.0), device="cpu")
            >>> state = amp.state_dict()
            >>> state["steps"], state["skipped"], state["scaler"]["scale"]
            (0, 0, 1024.0)
        """
        scaler = self._engine.state() if self._engine.active else self.scaler.state_dict()
        state: dict[str, Any] = {
            "scaler": scaler,
            "steps": self.steps,
            "skipped": self._skips.total,
        }
        if self.check is not None:
            state["config"] = self.config.to_dict()
            state["check"] = self.check.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; a resumed run keeps the in-run check's actions.

        Args:
            state: What :meth:`state_dict` returned.

        Example:
            >>> import scalertune
            >>> saved = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=1024.0), device="cpu")
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(), device="cpu")
            >>> amp.load_state_dict(saved.state_dict())
            >>> amp.scaler.get_scale()
            1024.0
        """
        if "config" in state and self.check is not None:
            saved = AmpConfig.from_dict(state["config"])
            if saved != self.config:
                self.reconfigure(saved)
        if state["scaler"]:  # a disabled scaler (float32) saves none
            self.load_scaler_state(state["scaler"])
        self.steps = int(state["steps"])
        self._skips.restore(int(state["skipped"]), steps=self.steps)
        if "check" in state and self.check is not None:
            self.check.load_state_dict(state["check"])

    def load_scaler_state(self, state: Mapping[str, Any]) -> None:
        """Start the scaler from ``state``, a checkpoint's or a replay's.

        A search's branch starts where the replay puts a config's scaler at its first step.
        GradScaler's keys go over its own state; with a bound engine
        (:meth:`~scalertune._amp._runtime.AmpRuntime.bind`), the engine's scaler takes them
        (kept for the engine until it is bound).

        Args:
            state: The scaler's state, or part of it, as its ``state_dict()`` keys it
                (GradScaler's ``scale``, ``_growth_tracker``, ...).

        Example:
            >>> import scalertune
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=1024.0), device="cpu")
            >>> amp.load_scaler_state({"scale": 64.0})
            >>> amp.scaler.get_scale()
            64.0
        """
        if self._engine.active:
            self._engine.load(state)
        else:
            self.scaler.load_state_dict({**self.scaler.state_dict(), **state})
