"""The scaler's knobs chosen again, from the run's own recent gradients.

When the loss scaler leaves what the search predicted for it (the watch: far more skipped
steps, or a scale far below the predicted range, as after a burst of large gradients that
backed the scale off further than the gradients that follow need), the in-run check records
the run's own gradients for ``TRACE_STEPS`` steps: each step's largest unscaled gradient,
on the device, one host read at the end (:class:`GradientTrace`). GradScaler's rule is then
replayed over that trace (``_replay._gradscaler.replay``, exact given which steps overflow)
for every config of a small grid around the run's own: the scale to restart from (just below
the largest gradient's overflow limit, and a few halvings under it), the growth interval,
the growth and backoff factors (:func:`choose_knobs`). The chosen one skips fewest (within
the replay's calibrated error), then keeps the scale closest under the limit (a scale far
below it flushes small gradients to zero: a run that stops learning), then changes fewest
knobs from the run's own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._amp._runtime import AmpRuntime
from scalertune._amp._scaler import grads_unscaled
from scalertune._amp._watch import ScalerPrediction
from scalertune._inrun._lines import LOGGER, heading
from scalertune._limits import FLOAT32_TINY
from scalertune._replay._gradscaler import THRESHOLD, limits, replay

#: Steps of gradients recorded before the knobs are chosen: one check interval's worth, so
#: the scale is back within about a hundred steps of the drift being seen; the replay then
#: takes well under a second.
TRACE_STEPS = 100

#: A window whose first half's largest gradient is more than this many times its second
#: half's still holds a burst that is over: 16 (four powers of two) is the watch's own
#: margin on the scale, and far past the drift of a training's gradients over 50 steps.
BURST = 2.0**4

#: A trace that has not settled (its steps still skip) after this many times its length is
#: taken as it is: the gradients stay as large as that.
SETTLE_LIMIT = 5

#: The growth intervals tried, besides the run's own.
GROWTH_INTERVALS = (50, 100, 200, 500, 1000, 2000)

#: The watch's prediction for the chosen knobs replays the trace this many times over: a
#: short growth interval that skips nothing in one trace's 100 steps grows into an overflow
#: every few intervals after, which is the scaler's steady state, not a drift.
PREDICTED_TRACES = 10

#: Scales to restart from: the highest power of two under the trace's smallest overflow
#: limit, and this many halvings below it (a margin for gradients a little larger than the
#: trace's).
RESTART_MARGINS = 4


class GradientTrace:
    """Each step's largest unscaled gradient over the last ``steps`` steps, kept on the
    device. A step whose scaled gradients overflowed (so they are inf after unscaling)
    records the least magnitude that overflows at its scale: its true gradient was at least
    that large, and the run skipped it.

    The trace is the evidence once it has :meth:`settled`: full, the run's own scaler
    skipped at most ``SKIP_TOLERANCE_STEPS`` of its steps, and the largest gradient of its
    first half at most ``BURST`` times that of its second half (a burst of large gradients
    has left the window, so the knobs are chosen for the gradients that follow it; a burst
    that lasts is the gradients now, and settles in the window as well); or it has been
    recorded for ``SETTLE_LIMIT`` times its length already.
    """

    def __init__(self, steps: int = TRACE_STEPS) -> None:
        self.steps = steps
        self.recorded = 0
        #: The step the last entry is of (``scaler.step`` runs once per optimizer).
        self._step: int | None = None
        self._amax: list[torch.Tensor] = []
        self._skipped: list[torch.Tensor] = []

    @property
    def full(self) -> bool:
        return len(self._amax) >= self.steps

    def settled(self) -> bool:
        """Whether the trace is the evidence now (one host read, once it is full)."""
        if not self.full:
            return False
        if self.recorded >= SETTLE_LIMIT * self.steps:
            return True
        amax = self.read()
        half = len(amax) // 2
        skipped = int(torch.stack(self._skipped).sum())
        return (
            skipped <= _policy.SKIP_TOLERANCE_STEPS
            and amax[:half].max() <= BURST * amax[half:].max()
        )

    def record(self, amp: AmpRuntime, optimizer: torch.optim.Optimizer) -> None:
        """Record this step's gradients, as ``scaler.step(optimizer)`` begins."""
        grads = [
            p.grad.detach()
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        if not grads:
            return
        peak = torch.stack([g.abs().amax().float() for g in grads]).amax()
        scale = amp.scale.float()
        if not grads_unscaled(amp.scaler, optimizer):
            peak = peak / scale
        finite = torch.isfinite(peak)
        if self._amax and self._amax[-1].device != peak.device:  # restored from a checkpoint
            self._amax = [a.to(peak.device) for a in self._amax]
            self._skipped = [s.to(peak.device) for s in self._skipped]
        amax, skipped = torch.where(finite, peak, THRESHOLD / scale), finite.logical_not()
        if self._step == amp.steps and self._amax:  # another optimizer of the same step:
            # one entry a step, its largest gradient of all (GradScaler skips the whole step)
            self._amax[-1] = torch.maximum(self._amax[-1], amax)
            self._skipped[-1] = self._skipped[-1] | skipped
            return
        self._step = amp.steps
        self._amax.append(amax)
        self._skipped.append(skipped)
        self.recorded += 1
        if len(self._amax) > self.steps:
            del self._amax[0], self._skipped[0]

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of a recording under way (one transfer): a run resumed
        from it goes on recording where it was, and chooses its knobs."""
        return {
            "steps": self.steps,
            "recorded": self.recorded,
            "amax": [float(a) for a in self._amax],
            "skipped": [bool(s) for s in self._skipped],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> GradientTrace:
        """The recording :meth:`state` kept (on the host until the next step is recorded)."""
        trace = cls(int(state["steps"]))
        trace.recorded = int(state["recorded"])
        trace._amax = [torch.tensor(float(a)) for a in state["amax"]]
        trace._skipped = [torch.tensor(bool(s)) for s in state["skipped"]]
        return trace

    def read(self) -> np.ndarray:
        """The trace on the host (one transfer), every rank's largest where there are ranks."""
        amax = torch.stack(self._amax).double()
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX)  # FSDP's shards: the largest of all
        return amax.cpu().numpy()


class KnobRecording:
    """The run's gradients recorded once the scaler left the search's prediction, until they
    settle; then the knobs chosen from them (:func:`choose_knobs`). A checkpoint keeps a
    recording under way (:meth:`state`), so that a resumed run goes on and chooses."""

    def __init__(self) -> None:
        self.trace: GradientTrace | None = None
        #: What the watch found, and at which step: said with the knobs chosen.
        self.drift = ""

    def start(self, step: int, found: str) -> None:
        """Start recording, and say so in the log (nothing where one is under way already)."""
        if self.trace is not None:
            return
        self.trace, self.drift = GradientTrace(), f"at step {step:,}, {found}"
        LOGGER.info(
            "%s: the loss scaler left the search's prediction (%s): recording its "
            "gradients to choose its knobs again",
            heading(step),
            found,
        )

    def record(self, amp: AmpRuntime, optimizer: torch.optim.Optimizer) -> None:
        if self.trace is not None:
            self.trace.record(amp, optimizer)

    def chosen(self, config: AmpConfig, scale: float) -> tuple[Knobs, str] | None:
        """The knobs and the drift they answer, once the trace settled (the recording ends
        there); ``None`` before."""
        if self.trace is None or not self.trace.settled():
            return None
        knobs = choose_knobs(self.trace.read(), config, scale)
        self.trace = None
        return knobs, self.drift

    def state(self) -> dict[str, Any] | None:
        return None if self.trace is None else {"trace": self.trace.state(), "drift": self.drift}

    def restore(self, state: Mapping[str, Any] | None) -> None:
        self.trace = None if state is None else GradientTrace.from_state(state["trace"])
        self.drift = "" if state is None else str(state["drift"])


@dataclasses.dataclass(frozen=True)
class Knobs:
    """The knobs chosen, the scale to restart from, and what each does over the trace."""

    config: AmpConfig
    scale: float
    skipped: int
    #: The run's own knobs, from its scale now, over the same trace.
    own_skipped: int
    #: Mean log2 of the overflow limit over the scale: how far under the limit it stays.
    headroom: float
    own_headroom: float
    steps: int
    #: What the chosen knobs do over the trace replayed ``PREDICTED_TRACES`` times: the
    #: prediction the watch follows from the restart on.
    prediction: ScalerPrediction


def choose_knobs(amax: np.ndarray, config: AmpConfig, scale_now: float) -> Knobs:
    """The grid's best config over the trace ``amax`` (see the module's docstring)."""
    limit = limits(amax)
    finite = limit[np.isfinite(limit) & (limit > 0)]
    top = 2.0 ** math.floor(math.log2(float(finite.min()))) if len(finite) else scale_now
    restarts = [top / 2.0**k for k in range(RESTART_MARGINS + 1)]
    own = _score(amax, limit, dataclasses.replace(config, init_scale=scale_now))
    scored = [(c, _score(amax, limit, c)) for c in _grid(config, restarts)]
    chosen, (skipped, headroom) = min(
        scored,
        key=lambda item: (
            max(item[1][0], _policy.SKIP_TOLERANCE_STEPS),  # within the replay's error: a tie
            round(item[1][1]),  # whole powers of two under the limit
            _changed(item[0], config),
        ),
    )
    steady = replay(np.tile(amax, PREDICTED_TRACES), chosen, lag=False)
    return Knobs(
        config=dataclasses.replace(
            config,
            growth_interval=chosen.growth_interval,
            growth_factor=chosen.growth_factor,
            backoff_factor=chosen.backoff_factor,
        ),
        scale=chosen.init_scale,
        prediction=ScalerPrediction(
            horizon=len(amax) * PREDICTED_TRACES,
            skipped_steps=len(steady.skipped),
            min_scale=max(steady.min_scale, FLOAT32_TINY),
            final_scale=max(steady.final_scale, FLOAT32_TINY),
        ),
        skipped=skipped,
        own_skipped=own[0],
        headroom=headroom,
        own_headroom=own[1],
        steps=len(amax),
    )


def _grid(config: AmpConfig, restarts: list[float]) -> list[AmpConfig]:
    intervals = sorted({config.growth_interval, *GROWTH_INTERVALS})
    factors = sorted({config.growth_factor, 2.0})
    backoffs = sorted({config.backoff_factor, 0.5})
    return [
        dataclasses.replace(
            config, init_scale=s, growth_interval=i, growth_factor=g, backoff_factor=b
        )
        for s in restarts
        for i in intervals
        for g in factors
        for b in backoffs
    ]


def _score(amax: np.ndarray, limit: np.ndarray, config: AmpConfig) -> tuple[int, float]:
    """Skipped steps and mean headroom (log2 of limit over scale, on the steps taken) of
    ``config`` over the trace."""
    run = replay(amax, config, per_step=True, lag=False)
    scales = run.scales if run.scales is not None else np.full(len(limit), config.init_scale)
    usable = np.isfinite(limit)
    usable[run.skipped] = False
    headroom = (
        float(np.mean(np.log2(limit[usable] / scales[usable].astype(np.float64))))
        if usable.any()
        else 0.0
    )
    return len(run.skipped), headroom


#: The knobs the grid changes (the scale is set where it restarts).
_KNOBS = ("growth_interval", "growth_factor", "backoff_factor")


def _changed(candidate: AmpConfig, config: AmpConfig) -> int:
    """How many of ``config``'s knobs ``candidate`` changes: a tie goes to changing fewest."""
    return sum(getattr(candidate, k) != getattr(config, k) for k in _KNOBS)
