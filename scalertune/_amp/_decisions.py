"""The steps a runtime's scaler decided: what a
:class:`~scalertune._amp._scaler.RuntimeScaler` tells its runtime (a loss scaled, a step
begun, a step decided), or what a bound engine decided (DeepSpeed's), counted, the skipped
steps among them, and the read-back at its cadence."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from scalertune._amp._engine import Engine
from scalertune._amp._readback import Readback
from scalertune._amp._scaler import DeviceStep, Skips


class ScalerDecisions:
    """The steps of an :class:`~scalertune.AmpRuntime`, owned by its
    :class:`~scalertune._amp._scaling.LossScaler`: how many, which were skipped
    (:class:`~scalertune._amp._scaler.Skips`), whether the last one was applied, and every
    ``readback.every`` steps the read-back (the guard, the watch, the in-run check). Whoever
    calls the scaler decides them: the runtime's own :meth:`~scalertune.AmpRuntime.step`,
    Accelerate's prepared optimizer, Lightning's precision plugin.

    Example:
        >>> decisions = ScalerDecisions(None)
        >>> decisions.taken()
        >>> decisions.state_dict()
        {'steps': 1, 'skipped': 0, 'streak': 0, 'startup': [0, -1, True]}
    """

    def __init__(self, readback: Readback | None) -> None:
        self.steps = 0
        #: Whether the optimizer stepped on the last step decided (a
        #: :class:`~scalertune._amp._scaler.DeviceStep` where only the device knows).
        self.last: bool | DeviceStep = True
        #: What reads the device back every ``readback.every`` steps; ``None``: nothing does.
        self.readback = readback
        self.skips = Skips(ring=readback.every if readback is not None else 0)

    def taken(self) -> None:
        """A step taken with no scaler to decide it (float32, or the scaler disabled)."""
        self.last = True
        self.steps += 1

    def updated(self, amp: Any, scaler: torch.amp.GradScaler) -> None:
        """``scaler.update()`` decided a step of ``amp`` (the runtime that owns this): counted,
        and read back when due."""
        self.last = self.skips.decide(scaler, self.steps)
        self.steps += 1
        readback = self.readback  # on every step: read here, not through _read_back
        if readback is not None and self.steps % readback.every == 0:
            readback.run(amp, self.skips)

    def engine_step(self, amp: Any, engine: Engine) -> bool:
        """The step of a bound engine (its clipping, its optimizer, its scaler: DeepSpeed's),
        decided on the host by the engine itself: counted, and read back when due."""
        stepped = self.last = engine.step()
        self.skips.host(self.steps, skipped=not stepped)
        self.steps += 1
        self._read_back(amp)
        return stepped

    def _read_back(self, amp: Any) -> None:
        if self.readback is not None and self.steps % self.readback.every == 0:
            self.readback.run(amp, self.skips)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the counts (``steps``, ``skipped``, the skips in a row and
        in the start-up burst) and, with a read-back, where its watch counts from, against
        which prediction, and whether it warned: a resumed run goes on as the run it resumes,
        not as a run starting at step 0 against the search's first prediction."""
        skips = self.skips
        state: dict[str, Any] = {
            "steps": self.steps,
            "skipped": skips.total,
            "streak": skips.streak,
            "startup": [skips.startup, skips.startup_last, skips.startup_open],
        }
        if self.readback is not None:
            state["readback"] = self.readback.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Count on from a checkpoint's counts (what :meth:`state_dict` returned; one saved
        before the streak and the read-back were kept restores the counts alone)."""
        self.steps = int(state["steps"])
        self.skips.restore(
            int(state["skipped"]),
            steps=self.steps,
            streak=int(state.get("streak", 0)),
            startup=state.get("startup"),
        )
        if self.readback is not None and state.get("readback") is not None:
            self.readback.load_state_dict(state["readback"])
