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

Stored with the study as one compressed blob: a 100,000-step trace takes about 0.5 MB. A
study is written by every worker, and by whoever else can write its storage: a trace read
back from it is data to check, never trusted (:meth:`Trace.decode`).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import math
import zipfile
import zlib
from typing import IO

import numpy as np

from scalertune import _limits
from scalertune._errors import DamagedEvidence

#: The exponents a histogram holds: float32's normal range, and zeros and non-finite values
#: in bins of their own (``hist[:, 0]`` zero, ``hist[:, 1]`` inf/NaN, then ``HIST_LOW``...).
HIST_LOW, HIST_HIGH = -126, 127
HIST_BINS = 2 + HIST_HIGH - HIST_LOW + 1
#: The most a stored trace holds, decompressed: two float32 a step over the longest horizon,
#: and room for the blocks' histograms and every module's forward peaks. A blob that would
#: decompress past it is not a trace scalertune wrote (and is not decompressed further).
MAX_TRACE_BYTES = 8 * _limits.MAX_HORIZON + 2**26
#: The arrays a stored trace holds: the kind of each one's values and its dimensions (the
#: start-up probe's two are missing from a trace stored before there was one).
_ARRAYS = {
    "amax": ("f", 1),
    "param_amax": ("f", 1),
    "block_starts": ("i", 1),
    "hist": ("i", 2),
    "forward": ("f", 2),
    "modules": ("U", 1),
    "startup": ("f", 1),
    "startup_whole": ("b", 0),
}
_OPTIONAL = ("startup", "startup_whole")


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
        """The trace :meth:`encode` wrote. Read back from a study, it is decompressed no
        further than ``MAX_TRACE_BYTES``, each array's kind and shape is checked before it is
        built (no pickle is ever read), and the arrays must fit together as a trace's do;
        :class:`~scalertune._errors.DamagedEvidence` naming what is wrong otherwise."""
        data = _arrays(_inflate(text))
        # a trace stored before the start-up probe reads as one without it
        trace = cls(
            amax=data["amax"],
            param_amax=data["param_amax"],
            block_starts=data["block_starts"],
            hist=data["hist"],
            forward=data["forward"],
            modules=tuple(str(m) for m in data["modules"]),
            startup=data.get("startup", np.zeros(0, np.float32)),
            startup_whole=bool(data.get("startup_whole", False)),
        )
        why = trace._what_is_wrong()
        if why is not None:
            raise DamagedEvidence(f"the gradient trace is damaged: {why}")
        return trace

    def _what_is_wrong(self) -> str | None:
        steps, blocks = len(self.amax), len(self.block_starts)
        if steps > _limits.MAX_HORIZON:
            return f"it holds {steps} steps, more than the longest horizon"
        if self.param_amax.shape != (steps,):
            return "its two per-step figures differ in length"
        if self.hist.shape != (blocks, HIST_BINS) or (self.hist < 0).any():
            return "its histograms are not one row of counts per block"
        if self.forward.shape != (blocks, len(self.modules)):
            return "its forward peaks are not one row per block, one column per module"
        starts = self.block_starts
        if blocks and (starts[0] < 0 or (np.diff(starts) < 0).any()):
            return "its blocks are out of order"
        return None

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


def _damaged(why: str) -> DamagedEvidence:
    return DamagedEvidence(f"the gradient trace is damaged: {why}")


def _inflate(text: object) -> bytes:
    """The npz archive :meth:`Trace.encode` compressed, decompressed no further than
    ``MAX_TRACE_BYTES``."""
    if not isinstance(text, str) or len(text) > 2 * MAX_TRACE_BYTES:
        raise _damaged(f"it is not text but {type(text).__name__}")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):  # binascii.Error is a ValueError
        raise _damaged("it is not base64 text") from None
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(raw, MAX_TRACE_BYTES + 1)
    except zlib.error:
        raise _damaged("it does not decompress") from None
    if len(data) > MAX_TRACE_BYTES:
        raise _damaged(f"it decompresses to more than {MAX_TRACE_BYTES} bytes")
    if not inflater.eof:
        raise _damaged("it is cut short")
    return data


def _arrays(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of the npz archive ``data``, each checked by its header (a name of
    ``_ARRAYS``, its kind and dimensions, no larger than its file) before it is read."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            found = {}
            for info in archive.infolist():
                name = info.filename.removesuffix(".npy")
                if name not in _ARRAYS or info.compress_type != zipfile.ZIP_STORED:
                    raise _damaged(f"it holds {info.filename!r}, which a trace does not")
                with archive.open(info) as f:
                    _check_header(name, f, info.file_size)
                    f.seek(0)
                    found[name] = np.lib.format.read_array(f, allow_pickle=False)
    except DamagedEvidence:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise _damaged(f"it is not the archive a trace is ({type(exc).__name__})") from None
    missing = [name for name in _ARRAYS if name not in found and name not in _OPTIONAL]
    if missing:
        raise _damaged(f"it has no {', '.join(missing)}")
    return found


def _check_header(name: str, f: IO[bytes], size: int) -> None:
    version = np.lib.format.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        raise _damaged(f"its {name} is in an npy format of another version")
    read = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, _, dtype = read(f)
    kind, dims = _ARRAYS[name]
    if dtype.hasobject or dtype.kind != kind or len(shape) != dims:
        raise _damaged(f"its {name} is {len(shape)}-D {dtype}, not what a trace holds")
    if math.prod(shape) * dtype.itemsize > size:
        raise _damaged(f"its {name} is larger than the bytes that hold it")
