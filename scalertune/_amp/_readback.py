"""What the runtime does at its read-back cadence: one host read of the loss scale (and of a
fused optimizer's skip flags), then the guard, the watch and the in-run check look at it."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

from scalertune import _policy
from scalertune._amp._check import RunCheck
from scalertune._amp._guard import Guard, check_guard
from scalertune._amp._scaler import Skips
from scalertune._amp._watch import AmpDriftWarning, ScalerPrediction, Watch, caller_stacklevel

#: Whose prediction a watch rebased by the in-run check holds, as its messages say it.
REPLAYED = "the in-run check's replay"


class Readback:
    """The guard, the watch and the in-run check, every ``every`` steps (the guard's cadence
    when there is one, else the watch's): one host read of the scale, then the check sees
    it (a loss that was not finite asks it to look at the forward), the guard may raise, and
    the watch may warn once (or, under an in-run check that acts, hand the drift to it)."""

    def __init__(self, guard: Guard | None, watch: Watch | None, check: RunCheck | None) -> None:
        self.guard, self.watch, self.check = guard, watch, check
        cadence = guard if guard is not None else watch
        self.every = cadence.check_every if cadence is not None else _policy.READBACK_INTERVAL
        self._warned = False
        #: Where the watch's prediction starts counting: (steps, skipped steps) at the last
        #: time the in-run check changed the scaler's knobs (and gave the watch a new one).
        self._since = (0, 0)
        #: Whether the in-run check was asked to look before the guard, since the guard
        #: last found the run healthy (asked once a collapse: then the guard stops it).
        self._rescued = False

    def rebase(self, prediction: ScalerPrediction | None, *, steps: int, skipped: int) -> None:
        """Watch from here on, counting from ``steps`` and ``skipped`` (the in-run check changed
        the run): against ``prediction`` (its new knobs') where given, else the watch's own."""
        if prediction is not None:
            self.watch = Watch(prediction, check_every=self.every, by=REPLAYED)
        self._since, self._warned = (steps, skipped), False

    def state_dict(self) -> dict[str, Any]:
        """Where the watch counts from, against which prediction, and whether it warned (and
        the check was asked to look before the guard): plain data for a checkpoint."""
        prediction = self.watch.prediction if self.watch is not None else None
        return {
            "since": list(self._since),
            "warned": self._warned,
            "rescued": self._rescued,
            "prediction": None if prediction is None else dataclasses.asdict(prediction),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from what :meth:`state_dict` saved: a watch rebased on the in-run check's
        knobs watches against their prediction again, from where they were set."""
        steps, skipped = state["since"]
        self._since = (int(steps), int(skipped))
        self._warned, self._rescued = bool(state["warned"]), bool(state["rescued"])
        saved = state.get("prediction")
        if saved is not None and self._since[0] > 0:  # rebased: the knobs' own prediction
            prediction = ScalerPrediction(**saved)
            if self.watch is None or prediction != self.watch.prediction:
                self.watch = Watch(prediction, check_every=self.every, by=REPLAYED)

    def _tripped(self, scale: float, streak: int) -> bool:
        guard = self.guard
        return guard is not None and (
            scale < guard.min_scale or streak >= guard.max_consecutive_skips
        )

    def run(self, amp: Any, skips: Skips) -> None:
        """Read ``skips`` and the scale, then look (``amp``: the
        :class:`~scalertune.AmpRuntime` that owns this)."""
        scale, skipped = skips.read(amp.scale)
        if self.check is not None and self.check.on_read(amp, scale=scale, bad_loss=skips.bad_loss):
            return  # it changed the scaler: what was read is from before
        if self.guard is not None:
            if not self._tripped(scale, skips.streak):
                self._rescued = False
            elif not self._rescued and self.check is not None and self.check.rescue(amp):
                self._rescued = True  # it looks at the next forward before the guard stops
                return
            else:  # tripped: the guard stops the run, saying whether the check looked
                check_guard(
                    self.guard,
                    scale=scale,
                    streak=skips.streak,
                    step=amp.steps,
                    islands=amp.config.fp32_modules,
                    checked=self.check is not None and self.check.policy.action == "act",
                )
        if self.watch is None or self._warned:
            return
        steps0, skipped0 = self._since
        rebased = steps0 > 0
        counts = dict(
            steps=amp.steps - steps0,
            skipped=skipped - skipped0,
            startup=0 if rebased else skips.startup,
            startup_last=-1 if rebased else skips.startup_last,
        )
        if self.check is not None and self.check.policy.action != "warn":
            found = self.watch.differences(amp.config, scale=scale, **counts)
            if found:
                self._warned = True
                self.check.on_drift(amp, "; ".join(found))
            return
        message = self.watch.drift(amp.config, scale=scale, **counts)
        if message is not None:
            self._warned = True
            warnings.warn(AmpDriftWarning(message), stacklevel=caller_stacklevel())
