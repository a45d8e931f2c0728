"""The watch: warn once, early, when a training run's loss scaler leaves the search's prediction.

A search that recommends float16 replays GradScaler over the float32 reference's gradient
trace and writes what it predicts into the result file (``evidence.prediction``): how many
steps the scaler skips over the horizon, how many of them in the start-up, and the range its
scale moves through. The prediction holds for *that* training: the same model, data and
learning rate. A run that skips far more, or whose scale sits far outside that range, is a
different training (other data, a larger learning rate, a changed model), and the config the
search chose for the first one may not suit it. The guard (:mod:`._guard`) stops a run whose
scale collapses; the watch says earlier, and without stopping anything, that the run is no
longer the one the search saw.

The bounds are the replay's own calibrated error, doubled: measured against real float16 runs
over 2,000 steps, its skip counts came within ``max(2 steps, 20%)`` and its start-up streak
was exact. A warning therefore means a difference the replay's error cannot explain.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from types import FrameType

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._errors import UsageError
from scalertune._limits import FLOAT32_MAX
from scalertune._text import shown

#: The replay's calibrated error on a skip count (``benchmarks/replay_calibration.py``): its
#: counts came within ``max(SKIP_ERROR_STEPS, SKIP_ERROR_SHARE * count)`` of real float16 runs;
#: the same tolerance the search ranks skip counts by.
SKIP_ERROR_STEPS = _policy.SKIP_TOLERANCE_STEPS
SKIP_ERROR_SHARE = _policy.SKIP_TOLERANCE_SHARE

#: The watch warns only past this many times the calibrated error: a run at the edge of the
#: replay's accuracy (a seed whose first gradients are a little larger) is still the run the
#: search saw, and a warning users learn to ignore protects nothing. For the start-up streak,
#: which the replay predicts exactly, twice the smallest error is 4 extra skipped steps: the
#: first gradients 16 times larger than the reference's at the default backoff of 0.5.
DRIFT_MARGIN = 2

#: How far outside the predicted scale range the scale may go: 16 (2**4). The scale follows
#: ``65504 / largest gradient``: 16 times below the lowest predicted scale means gradient
#: peaks 16 times larger than any the reference had, the same four powers of two the
#: start-up allows; at PyTorch's defaults it is also four back-offs (or growths) more than
#: predicted, twice the replay's 2-step error.
SCALE_SLACK = 2.0**4

#: The start-up burst is counted by the replay's own rule, so that the run's and the
#: predicted one compare.
STARTUP_GAP = _policy.STARTUP_GAP


class AmpDriftWarning(UserWarning):
    """The run's loss scaler left what the search predicted: the message says what differs."""


@dataclasses.dataclass(frozen=True)
class ScalerPrediction:
    """What the search predicted GradScaler does over the first ``horizon`` steps: the
    ``evidence.prediction`` block of a result file.

    ``skipped_steps`` counts every skipped step over the horizon, ``skipped_first`` those of
    the start-up burst among them; ``min_scale`` and ``final_scale`` are the lowest and the last
    scale. ``max_scale``, when the file has it, is the highest (otherwise the higher of the
    config's ``init_scale`` and ``final_scale``, the two the scale certainly passes).
    """

    horizon: int
    skipped_steps: int
    min_scale: float
    final_scale: float
    skipped_first: int = 0
    max_scale: float | None = None

    def __post_init__(self) -> None:
        for name, low in (("horizon", 1), ("skipped_steps", 0), ("skipped_first", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UsageError(
                    f"the prediction's {name} must be an integer >= {low}, got {shown(value)}"
                )
        if not self.skipped_first <= self.skipped_steps <= self.horizon:
            raise UsageError(
                f"the prediction's counts must satisfy skipped_first <= skipped_steps <= "
                f"horizon, got {self.skipped_first}, {self.skipped_steps}, {self.horizon}"
            )
        for name in ("min_scale", "final_scale", "max_scale"):
            value = getattr(self, name)
            if value is None and name == "max_scale":
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (0 < value <= FLOAT32_MAX)
            ):
                raise UsageError(
                    f"the prediction's {name} must be a finite number > 0, got {shown(value)}"
                )


@dataclasses.dataclass(frozen=True)
class Watch:
    """Warn once, early, when the run's loss scaler leaves the search's prediction.

    Every ``check_every`` steps (the guard's cadence when there is a guard; the same one host
    read) the runtime compares what its scaler did so far with ``prediction`` and issues one
    :class:`AmpDriftWarning` at the first check where

    - the start-up burst skipped more than ``DRIFT_MARGIN * SKIP_ERROR_STEPS`` steps beyond
      the predicted one (which the replay gets exactly);
    - or the run skipped more steps than the prediction allows for the steps run so far: the
      start-up, plus the later skips pro rata over the horizon (extrapolated past it), plus
      ``DRIFT_MARGIN`` times the replay's error ``max(2, 20%)`` on the horizon's count;
    - or the scale is more than ``SCALE_SLACK`` below the lowest predicted scale, or (within
      the horizon, past which a healthy scaler keeps growing) that much above the highest.

    Example:
        >>> import torch, warnings, scalertune
        >>> from scalertune._amp._watch import ScalerPrediction, Watch
        >>> watch = Watch(ScalerPrediction(horizon=100, skipped_steps=0, min_scale=2.0**8,
        ...                                final_scale=2.0**8), check_every=5)
        >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=2.0**8),
        ...                             device="cpu", watch=watch)
        >>> model = torch.nn.Linear(4, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        >>> x = torch.randn(8, 4)
        >>> big = (x, 1e4 * x.sum(1, keepdim=True))  # a loss the search never saw
        >>> sq = lambda o, y: ((o - y) ** 2).sum()
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     for _ in range(10):
        ...         _ = amp.train_step(model, optimizer, sq, big)
        >>> [type(w.message).__name__ for w in caught]
        ['AmpDriftWarning']
    """

    prediction: ScalerPrediction
    check_every: int = _policy.READBACK_INTERVAL
    #: Whose prediction it is, as the messages say it: the search's, or the in-run check's
    #: replay of the run's own gradients once it set the scaler's knobs.
    by: str = "the search"

    def __post_init__(self) -> None:
        if not isinstance(self.prediction, ScalerPrediction):
            raise UsageError(f"the watch needs a ScalerPrediction, got {shown(self.prediction)}")
        value = self.check_every
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError(f"the watch's check_every must be an integer >= 1, got {shown(value)}")

    def allowed_skips(self, steps: int) -> float:
        """The most skipped steps a run of ``steps`` steps may have and still be the predicted
        one: the start-up, the later skips pro rata, and twice the replay's error."""
        p = self.prediction
        expected = p.skipped_first + (p.skipped_steps - p.skipped_first) * steps / p.horizon
        error = max(SKIP_ERROR_STEPS, SKIP_ERROR_SHARE * max(p.skipped_steps, expected))
        return expected + DRIFT_MARGIN * error

    def drift(
        self,
        config: AmpConfig,
        *,
        steps: int,
        skipped: int,
        startup: int,
        startup_last: int,
        scale: float,
    ) -> str | None:
        """What differs from the prediction after ``steps`` steps, in words (``None``: the run
        is the predicted one). ``startup`` counts the start-up burst's skips so far, its last
        at step ``startup_last``; ``scale`` is the loss scale now."""
        found = self.differences(
            config,
            steps=steps,
            skipped=skipped,
            startup=startup,
            startup_last=startup_last,
            scale=scale,
        )
        if not found:
            return None
        return (
            f"AMP watch at step {steps:,}: " + "; ".join(found) + f". The run is no longer "
            f"the one {self.by} saw (other data, learning rate or model?): rerun "
            "scalertune search on it (scalertune.load(..., watch=False) silences this)"
        )

    def differences(
        self,
        config: AmpConfig,
        *,
        steps: int,
        skipped: int,
        startup: int,
        startup_last: int,
        scale: float,
    ) -> list[str]:
        """Each way the run differs from the prediction, a clause each (see :meth:`drift`)."""
        p, found = self.prediction, []
        if (
            startup > p.skipped_first + DRIFT_MARGIN * SKIP_ERROR_STEPS
            and startup_last < p.horizon / 2
        ):
            larger = (1 / config.backoff_factor) ** (startup - p.skipped_first)
            found.append(
                f"its start-up has skipped {startup} steps where {self.by} "
                f"predicted {p.skipped_first} (exact in calibration): its first "
                f"gradients are at least {larger:.3g} times larger than the search's"
            )
        if skipped > self.allowed_skips(steps):
            found.append(
                f"this run skipped {skipped:,} steps in its first {steps:,}; "
                f"{self.by} predicted {p.skipped_steps:,} over {p.horizon:,}"
                + (f" ({p.skipped_first} of them in the start-up)" if p.skipped_first else "")
            )
        highest = max(p.max_scale or 0.0, p.final_scale, config.init_scale)
        if scale < p.min_scale / SCALE_SLACK:
            below = p.min_scale / scale if scale > 0 else math.inf  # backed off to zero
            found.append(
                f"the loss scale is {scale:.3g}, {below:.3g} times "
                f"below the lowest {self.by} predicted ({p.min_scale:.3g}): "
                f"gradients overflow float16 at scales {self.by} saw hold"
            )
        elif steps <= p.horizon and scale > highest * SCALE_SLACK:
            found.append(
                f"the loss scale is {scale:.3g}, {scale / highest:.3g} times above "
                f"the highest {self.by} predicted ({highest:.3g}): the gradients "
                "are much smaller than the search's"
            )
        return found


def caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside scalertune: the
    user's ``amp.step`` or ``amp.train_step`` line, whichever of them it came through (or the
    framework's line that called into the runtime)."""
    package, level = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep, 1
    frame: FrameType | None = sys._getframe(1)  # noqa: SLF001 - the standard way to walk the stack
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level
