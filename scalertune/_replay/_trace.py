"""The gradient trace of a run: what GradScaler's decisions depend on, step by step.

GradScaler skips a step when the scaled gradients hold an inf or NaN. Under autocast that
happens, to first order, when the scale times the largest gradient that float16 holds in
backward (a parameter's gradient, or the gradient flowing into a module's output) reaches
65520, the smallest magnitude float16 rounds to inf. So one trace of that largest magnitude
per step, recorded once along the float32 reference (whose gradients are the true, unscaled
and unrounded ones) tells what any scaler setting would do over the horizon.

Per step: ``amax`` (the largest over parameter and activation gradients) and ``param_amax``
(parameter gradients alone). Per block of steps (``blocks`` rows over the run): a log2
histogram of the gradient magnitudes on the steps sampled in it (``hist``, bin ``k`` holding
``floor(log2 |g|) == HIST_LOW + k``), enough to tell the share of values that would flush
below float16's smallest subnormal, or fall below its smallest normal, at any scale; and each
module's largest forward output (``forward``), for the forecast of a range that runs out.

Stored with the study as one compressed blob: a 100,000-step trace takes about 0.5 MB.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import zlib

import numpy as np

#: The exponents a histogram holds: float32's normal range, and zeros and non-finite values
#: in bins of their own (``hist[:, 0]`` zero, ``hist[:, 1]`` inf/NaN, then ``HIST_LOW``...).
HIST_LOW, HIST_HIGH = -126, 127
HIST_BINS = 2 + HIST_HIGH - HIST_LOW + 1


@dataclasses.dataclass
class Trace:
    """A run's gradient magnitudes, per step and per block (see the module's docstring)."""

    amax: np.ndarray
    param_amax: np.ndarray
    #: The first step of each block; the histogram and forward peaks of the steps sampled in it.
    block_starts: np.ndarray
    hist: np.ndarray
    forward: np.ndarray
    modules: tuple[str, ...] = ()
    #: The start-up probe: the largest gradient of each of the first batches at the initial
    #: weights. A scale too large for them skips step after step from the start, and while
    #: it does the weights do not move: those steps see these gradients, not the trace's.
    startup: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.float32))
    #: Whether the probe covered one whole pass over the batches: only then does a step lag
    #: behind the trace by whole passes (the replay's lag model); a longer pass is read at its
    #: own step after the start-up streak.
    startup_whole: bool = False

    @property
    def steps(self) -> int:
        return len(self.amax)

    def encode(self) -> str:
        """The trace as one ASCII string (zlib-compressed npz), for a study attribute."""
        buffer = io.BytesIO()
        np.savez(
            buffer,
            amax=self.amax.astype(np.float32),
            param_amax=self.param_amax.astype(np.float32),
            block_starts=self.block_starts.astype(np.int64),
            hist=self.hist.astype(np.int64),
            forward=self.forward.astype(np.float32),
            modules=np.array(self.modules, dtype=str),
            startup=self.startup.astype(np.float32),
            startup_whole=np.array(self.startup_whole),
        )
        return base64.b64encode(zlib.compress(buffer.getvalue(), 9)).decode("ascii")

    @classmethod
    def decode(cls, text: str) -> Trace:
        data = np.load(io.BytesIO(zlib.decompress(base64.b64decode(text))), allow_pickle=False)
        # a trace stored before the start-up probe reads as one without it
        startup = data["startup"] if "startup" in data.files else np.zeros(0, np.float32)
        whole = bool(data["startup_whole"]) if "startup_whole" in data.files else False
        return cls(
            amax=data["amax"],
            param_amax=data["param_amax"],
            block_starts=data["block_starts"],
            hist=data["hist"],
            forward=data["forward"],
            modules=tuple(str(m) for m in data["modules"]),
            startup=startup,
            startup_whole=whole,
        )

    def floored(self, least: float) -> Trace:
        """This trace with every step's largest gradient at least ``least``: a float16 loss
        (DeepSpeed's fp16 mode computes one from float16 outputs) seeds its backward with
        the loss scale times its own gradient, 1, which overflows from 65520 on."""
        return dataclasses.replace(
            self, amax=np.maximum(self.amax, least), startup=np.maximum(self.startup, least)
        )

    def share_below(
        self, scale: float, limit: float, start: int = 0, end: int | None = None
    ) -> float:
        """The share of the nonzero finite gradient values, over the blocks from ``start`` to
        ``end``, whose magnitude times ``scale`` is below ``limit`` (``2**-24``: they flush to
        zero in float16; ``2**-14``: subnormal). A bin counts as below when its top edge is."""
        end = self.steps if end is None else end
        rows = (self.block_starts >= start) & (self.block_starts < end)
        counts = self.hist[rows].sum(axis=0).astype(np.float64)
        values = counts[2:]
        total = values.sum()
        if total == 0:
            return 0.0
        exponents = np.arange(HIST_LOW, HIST_HIGH + 1, dtype=np.float64)
        below = np.exp2(exponents + 1) * scale <= limit
        return float(values[below].sum() / total)


def empty(modules: tuple[str, ...] = ()) -> Trace:
    return Trace(
        amax=np.zeros(0, np.float32),
        param_amax=np.zeros(0, np.float32),
        block_starts=np.zeros(0, np.int64),
        hist=np.zeros((0, HIST_BINS), np.int64),
        forward=np.zeros((0, len(modules)), np.float32),
        modules=modules,
    )
