"""The runtime's side of its GradScaler's steps: what a
:class:`~scalertune._amp._scaler.RuntimeScaler` tells it (a loss scaled, a step begun, a step
decided), or what a bound engine decided (DeepSpeed's), the skipped steps counted from that,
and the scale read in place."""

from __future__ import annotations

import torch

from scalertune._amp._check import RunCheck
from scalertune._amp._engine import Engine, EngineSlot
from scalertune._amp._readback import Readback
from scalertune._amp._scaler import DeviceStep, Skips
from scalertune._amp._torch_private import live_scale


class ScalerDecisions:
    """What :class:`~scalertune.AmpRuntime` hears from its scaler (whoever calls the scaler:
    the runtime's own :meth:`~scalertune.AmpRuntime.step`, Accelerate's prepared optimizer,
    Lightning's precision plugin), and what it reads of it."""

    scaler: torch.amp.GradScaler
    check: RunCheck | None
    device: torch.device
    steps: int
    _checks: Readback | None
    _skips: Skips
    _stepped: bool | DeviceStep
    _uses_scaler: bool
    _initial_scale: torch.Tensor
    _engine: EngineSlot

    @property
    def last_step(self) -> bool | DeviceStep:
        """Whether the optimizer really stepped on the last step GradScaler decided (what
        :meth:`~scalertune._amp._runtime.AmpRuntime.step` returned; for a framework that
        calls the scaler itself, the same)."""
        return self._stepped

    def scaler_scaling(self, loss: torch.Tensor) -> None:
        """Hook the runtime's GradScaler calls as ``scaler.scale(loss)`` runs; not for users.

        With an in-run check, a loss that is not finite is noted for the next read-back (see
        ``Skips.note_loss``).

        Args:
            loss: The loss being scaled.
        """
        if self._checks is not None and self.check is not None:
            self._skips.note_loss(loss)

    def scaler_stepping(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook the runtime's GradScaler calls as ``scaler.step(optimizer)`` starts; not for users.

        Args:
            optimizer: The optimizer being stepped.
        """
        if self.check is not None and self.check.recording:
            self.check.record(self, optimizer)
        self._skips.begin(self.scaler, optimizer)

    def scaler_updated(self) -> None:
        """Hook the runtime's GradScaler calls once ``scaler.update()`` has decided the step.

        Counts the step, and runs the guard and the watch when they are due. After the in-run
        check fell back to float32 the scaler is disabled and every step it passes through is
        taken. Not for users.
        """
        if not self._uses_scaler:
            self._stepped = True
            self.steps += 1
            return
        self._stepped = self._skips.decide(self.scaler, self.steps)
        self.steps += 1
        if self._checks is not None and self.steps % self._checks.every == 0:
            self._checks.run(self, self._skips)

    def _engine_step(self, engine: Engine) -> bool:
        """The step of a bound engine (its clipping, its optimizer, its scaler: DeepSpeed's),
        decided on the host by the engine itself: counted, and read back when due."""
        stepped = self._stepped = engine.step()
        self._skips.host(self.steps, skipped=not stepped)
        self.steps += 1
        if self._checks is not None and self.steps % self._checks.every == 0:
            self._checks.run(self, self._skips)
        return stepped

    @property
    def readback(self) -> Readback | None:
        """What reads the device back every so many steps for the guard, the watch and the
        in-run check (``None``: nothing does); the check rebases the watch on it after it
        changed the run."""
        return self._checks

    @property
    def scale(self) -> torch.Tensor:
        """The current loss scale as a device tensor (1.0 when no scaler is active; a bound
        engine's own scale); no sync."""
        if self._engine.engine is not None:
            return torch.full((), self._engine.engine.scale(), device=self.device)
        if not self._uses_scaler:  # a disabled GradScaler has no _scale at all
            return self._initial_scale
        scale = live_scale(self.scaler)
        if scale is None:
            return self._initial_scale
        # GradScaler keeps a 0-d tensor; reshaping one anyway is a device op on every step.
        return scale if scale.dim() == 0 else scale.reshape(())

    @property
    def skipped_steps(self) -> int:
        """Steps GradScaler skipped because gradients were inf/NaN (no device read, except
        for an optimizer that skips inside its own kernel: see
        :class:`~scalertune._amp._scaler.Skips`)."""
        return self._skips.total

    @property
    def skipped_on_device(self) -> torch.Tensor:
        """:attr:`skipped_steps` as a new 0-d int64 tensor on the device, read without a host
        sync (also where an optimizer skips inside its own kernel): the skips over a window
        are two of them subtracted, read with the window's end."""
        return self._skips.on_device(self.device)
