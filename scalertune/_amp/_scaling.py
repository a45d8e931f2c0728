"""What scales a runtime's loss and decides its steps: its GradScaler, or the scaler of an
engine bound to it (DeepSpeed's); the step they take (unscale, clip, step unless skipped,
update), the scale read in place, the scaler's state in a checkpoint, and its knobs changed
between steps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from scalertune._amp._autocast import Clip
from scalertune._amp._config import SCALER_KNOBS, AmpConfig, DeepSpeedFp16Config
from scalertune._amp._decisions import ScalerDecisions
from scalertune._amp._engine import EngineSlot
from scalertune._amp._readback import Readback
from scalertune._amp._scaler import (
    DeviceStep,
    RuntimeScaler,
    scaler_class,
    set_knobs,
)
from scalertune._amp._torch_private import live_scale


class LossScaler:
    """The loss scaler an :class:`~scalertune.AmpRuntime` (``owner``) owns: its GradScaler (a
    :class:`~scalertune._amp._scaler.RuntimeScaler` that tells this object about each step;
    disabled for bfloat16 and float32), or the engine's where one is needed or bound
    (:class:`~scalertune._amp._engine.EngineSlot`); and the steps they decided
    (:class:`~scalertune._amp._decisions.ScalerDecisions`), read back by ``readback``."""

    def __init__(
        self,
        config: AmpConfig,
        device: torch.device,
        *,
        owner: Any,
        readback: Readback | None,
    ) -> None:
        self.device = device
        self._owner = owner
        #: The engine that scales and steps itself, needed (a DeepSpeed fp16 config) or bound.
        self.engine = EngineSlot(needed=isinstance(config, DeepSpeedFp16Config))
        #: Whether the GradScaler decides the steps: read on every step, a plain attribute;
        #: ``False`` from the in-run check's fall back to float32 on.
        self.decides = config.uses_scaler and not self.engine.needed
        self.scaler: torch.amp.GradScaler = self._made(RuntimeScaler, config)
        #: The scale where no GradScaler decides, made once: 1.0 (bfloat16, float32, after a
        #: fall back), or a needed engine's initial scale until the engine is bound.
        self._fixed = torch.full(
            (), config.init_scale if self.engine.needed else 1.0, device=device
        )
        self.decisions = ScalerDecisions(readback)

    def _made(self, kind: type[torch.amp.GradScaler], config: AmpConfig) -> torch.amp.GradScaler:
        return kind(
            self.device.type,
            listener=self,  # type: ignore[call-arg]
            enabled=config.uses_scaler and not self.engine.needed,
            **{k: getattr(config, k) for k in SCALER_KNOBS},
        )

    def fit(self, model: torch.nn.Module, config: AmpConfig) -> None:
        """Take the scaler ``model`` needs (``ShardedGradScaler`` for FSDP1: see
        :func:`~scalertune._amp._scaler.scaler_class`), made from ``config``, while the one
        it has has scaled no loss in this process: a checkpoint's state, or a scale set,
        carries over to it."""
        if not self.decides or live_scale(self.scaler) is not None:
            return
        kind = scaler_class(model)
        if type(self.scaler) is not kind:
            state = self.scaler.state_dict()  # loaded from a checkpoint, or set: kept
            self.scaler = self._made(kind, config)
            self.scaler.load_state_dict(state)

    def step(
        self, amp: Any, optimizer: torch.optim.Optimizer, clip: Clip | None
    ) -> bool | DeviceStep:
        """``amp``'s step (see :meth:`~scalertune.AmpRuntime.step`): the engine's, where one is
        bound; else unscale and ``clip``, then GradScaler's step and update, which decide it
        (a plain optimizer step without a scaler)."""
        engine = self.engine.engine
        if engine is not None:
            return self.decisions.engine_step(amp, engine)
        if clip is not None:
            clip(self.scaler, optimizer)
        if not self.decides:
            optimizer.step()
            self.decisions.steps += 1
            return True
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.decisions.last

    # What its RuntimeScaler tells it (a StepListener), whoever calls the scaler: on every
    # step, so each goes straight to what it changes.

    def scaler_scaling(self, loss: torch.Tensor) -> None:
        """``scaler.scale(loss)`` runs: with an in-run check that reads back, a loss that is
        not finite is noted for the next read (``Skips.note_loss``)."""
        if self._owner.check is not None and self.decisions.readback is not None:
            self.decisions.skips.note_loss(loss)

    def scaler_stepping(self, optimizer: torch.optim.Optimizer) -> None:
        """``scaler.step(optimizer)`` begins: the in-run check records the step when it
        asked to, and the skips note the scale before it (``Skips.begin``)."""
        check = self._owner.check
        if check is not None and check.recording:
            check.record(self._owner, optimizer)
        self.decisions.skips.begin(self.scaler, optimizer)

    def scaler_updated(self) -> None:
        """``scaler.update()`` decided a step: counted, and read back when due; after the
        in-run check fell back to float32 the scaler is disabled and every step it passes
        through is taken."""
        if self.decides:
            self.decisions.updated(self._owner, self.scaler)
        else:
            self.decisions.taken()

    @property
    def scale(self) -> torch.Tensor:
        """The loss scale as a 0-d device tensor (1.0 when no scaler is active; a bound
        engine's own); no sync."""
        engine = self.engine.engine
        if engine is not None:
            return torch.full((), engine.scale(), device=self.device)
        if not self.decides:  # a disabled GradScaler scales nothing
            return self._fixed
        scale = live_scale(self.scaler)
        if scale is None:  # before its first scale(): where it starts (a host float, no sync)
            return torch.full((), self.scaler.get_scale(), device=self.device)
        # GradScaler keeps a 0-d tensor; reshaping one anyway is a device op on every step.
        return scale if scale.dim() == 0 else scale.reshape(())

    def configure(self, config: AmpConfig, *, scale: float | None) -> None:
        """Set ``config``'s knobs (and ``scale``, where given) in place; a config without a
        scaler (float32) disables it, a config with one enables it again (a run rolled back to
        a checkpoint from before its fall back to float32)."""
        if self.engine.needed:  # the engine's own scaler: nothing of the GradScaler's
            return
        if config.uses_scaler:
            set_knobs(self.scaler, config, scale=scale)  # back on, after float32 (a rollback)
            self.decides = True
        elif self.decides:
            set_knobs(self.scaler, None)  # float32 from now on: no scaler
            self.decides, self.decisions.last = False, True  # every later step is taken

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of it: the scaler's state (``{}`` for a disabled
        GradScaler; an engine's own), then the counts (``steps``, ``skipped``)."""
        scaler = self.engine.state() if self.engine.active else self.scaler.state_dict()
        return {"scaler": scaler, **self.decisions.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if state["scaler"]:  # a disabled scaler (float32) saves none
            self.load(state["scaler"])
        self.decisions.load_state_dict(state)

    def load(self, state: Mapping[str, Any]) -> None:
        """Start from ``state``, or part of it: over GradScaler's own state, or the engine's
        (kept for it until it is bound)."""
        if self.engine.active:
            self.engine.load(state)
        else:
            self.scaler.load_state_dict({**self.scaler.state_dict(), **state})
