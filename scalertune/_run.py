"""Run one configuration on a fresh workload and watch it for non-finite values.

The AMP loop never waits for the device. Each step writes its loss and the current loss scale
into preallocated device buffers; every ``READBACK_INTERVAL`` steps one transfer brings the
window to the host, where it is checked, reported and timed. On CUDA that transfer is the
synchronisation point, so the window's wall time covers exactly the work of its steps.

After each window a stop rule (:mod:`scalertune._stopping`) may end the run early: it has
reached the float32 target, or it can no longer beat the best run found so far.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import math
import statistics
import struct
import time
from typing import Any, Callable, Iterator, Sequence

import torch

from scalertune import _policy
from scalertune._config import AmpConfig
from scalertune._errors import UsageError
from scalertune._runtime import AmpRuntime
from scalertune._workload import Workload, build_workload, one_line, to_device

#: Prune kinds, in the words the summary and the dashboard use.
PRUNE_KINDS = {
    "forward": "forward overflow",
    "diverged": "diverged",
    "parameters": "non-finite weights",
    "gradients": "gradients non-finite every step",
    "scale-collapse": "scale collapse",
    "slower": "slower than the best",
}


def as_float32(value: float) -> float:
    """``value`` rounded to float32, as GradScaler stores its scale."""
    return struct.unpack("f", struct.pack("f", value))[0]


def skipped_steps(scales: Sequence[float], init_scale: float) -> list[int]:
    """Indices of the steps GradScaler skipped, from the scale after each step.

    ``update()`` multiplies the scale by ``backoff_factor`` < 1 exactly when a step was
    skipped, so a smaller scale than the step before *is* a skipped step. The scaler keeps its
    scale in float32: the first step compares with ``init_scale`` rounded the same way (an
    init_scale float32 cannot hold exactly would otherwise look like a back-off at step 0).
    """
    out, previous = [], as_float32(init_scale)
    for i, scale in enumerate(scales):
        if scale < previous:
            out.append(i)
        previous = scale
    return out


@dataclasses.dataclass
class RunRecord:
    """What one run did, step by step: the evidence every judgement is made from."""

    config: AmpConfig
    seed: int
    steps: int
    losses: list[float] = dataclasses.field(default_factory=list)
    scales: list[float] = dataclasses.field(default_factory=list)
    window_step_times: list[float] = dataclasses.field(default_factory=list)
    prune_kind: str | None = None
    prune_reason: str | None = None
    #: Steps to the float32 target (1-based), once the stop rule has seen it reached.
    reached_at: int | None = None
    #: Why the run ended before ``steps``: "reached" (the target), or a prune kind.
    stopped: str | None = None

    @property
    def steps_run(self) -> int:
        return len(self.losses)

    @property
    def skipped(self) -> list[int]:
        """Indices of the steps GradScaler skipped (the scale shrank on them)."""
        if not self.config.uses_scaler:
            return []
        return skipped_steps(self.scales, self.config.init_scale)

    @property
    def first_nonfinite_step(self) -> int | None:
        """The first step whose loss or gradients were inf/NaN (0-based), if any."""
        bad_loss = next((i for i, v in enumerate(self.losses) if not math.isfinite(v)), None)
        skipped = self.skipped
        candidates = [s for s in (bad_loss, skipped[0] if skipped else None) if s is not None]
        return min(candidates) if candidates else None

    @property
    def median_step_time(self) -> float:
        """Median seconds per step over the windows after warm-up."""
        times = self.window_step_times[_policy.WARMUP_WINDOWS:] or self.window_step_times
        return statistics.median(times) if times else math.nan

    @property
    def pruned(self) -> bool:
        return self.prune_kind is not None


WindowCallback = Callable[[RunRecord, int], None]
#: Called after each window that left the run finite; returns True to stop the run there.
StopRule = Callable[[RunRecord], bool]


def run_config(
    factory: Callable[[], Any],
    config: AmpConfig,
    *,
    steps: int,
    seed: int,
    device: torch.device,
    on_window: WindowCallback | None = None,
    stop: StopRule | None = None,
    prune: bool = True,
) -> RunRecord:
    """Train a fresh workload for up to ``steps`` steps under ``config``.

    The run stops early when it goes non-finite (it is pruned, with the reason) or when
    ``stop(record)`` says so after a window. ``on_window(record, first_step_of_window)`` is
    called after each window has been read back and judged (reporting lives there).
    ``prune=False`` records why the run would have been pruned but trains to the end (what a
    search without pruning would cost; ``benchmarks/pruning.py`` compares the two).
    """
    workload = build_workload(factory, seed=seed, device=device)
    size = sum(p.numel() * p.element_size() for p in workload.model.parameters())
    try:
        record = train(workload, config, steps=steps, seed=seed, device=device,
                       on_window=on_window, stop=stop, prune=prune)
    finally:
        del workload
        release_memory(size)
    return record


def train(workload: Workload, config: AmpConfig, *, steps: int, seed: int,
          device: torch.device, on_window: WindowCallback | None = None,
          stop: StopRule | None = None, prune: bool = True) -> RunRecord:
    """The training loop of :func:`run_config`, on a workload already built."""
    amp = AmpRuntime(config, device=device)
    amp.prepare(workload.model)
    record = RunRecord(config=config, seed=seed, steps=steps)
    loss_buf = torch.empty(steps, dtype=torch.float32, device=device)
    scale_buf = torch.empty(steps, dtype=torch.float32, device=device)
    batches = forever(workload.batches)
    step_fn = step_function(workload)
    workload.model.train()

    window_start = 0
    started = time.perf_counter()
    for i in range(steps):
        batch = to_device(next(batches), device)
        loss = step_fn(workload, batch, amp)
        loss_buf[i] = loss.detach()
        scale_buf[i] = amp.scale
        if (i + 1) % _policy.READBACK_INTERVAL and i + 1 < steps:
            continue
        window = torch.stack((loss_buf[window_start : i + 1], scale_buf[window_start : i + 1]))
        window = window.cpu()  # the one host sync per window
        record.window_step_times.append((time.perf_counter() - started) / (i + 1 - window_start))
        record.losses.extend(window[0].tolist())
        record.scales.extend(window[1].tolist())
        if not record.pruned:
            _judge_window(record, workload, window_start)
        stopping = stop is not None and not record.pruned and stop(record)
        if on_window is not None:
            on_window(record, window_start)
        if stopping or (record.pruned and prune):
            break
        window_start = i + 1
        started = time.perf_counter()
    return record


def release_memory(model_bytes: int = 0) -> None:
    """Give the memory of a finished run back to the system before the next one.

    A search builds a fresh workload for every run. Python frees the last one as its
    references go, but glibc's allocator keeps freed pages in its arenas, so without a trim
    the process's resident memory grows run after run to several runs' worth of a large
    model. A full garbage collection (for workloads that hold reference cycles) costs a third
    of a second in a process that has imported torch and optuna: it runs only when the model
    is large enough for that to matter (``RELEASE_COLLECT_BYTES``).
    """
    if model_bytes >= _policy.RELEASE_COLLECT_BYTES:
        gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only; musl and macOS have none
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def check_loss(loss: Any) -> None:
    """A step's result must be a scalar tensor; say so in one line otherwise."""
    if not isinstance(loss, torch.Tensor):
        raise UsageError(
            f"the loss is a {type(loss).__name__}, not a tensor: loss_fn (or step) must "
            "return the scalar loss tensor"
        )
    if loss.dim() != 0:
        raise UsageError(
            f"the loss has shape {tuple(loss.shape)}, not a scalar: reduce it "
            "(e.g. reduction='mean') before returning it"
        )


def preflight(factory: Callable[[], Any], *, device: torch.device, seed: int,
              islands: set[str] = frozenset()) -> AmpConfig:
    """One float32 step on a fresh workload: catches a bad loss before any study row exists.

    Also checks that every module named in ``islands`` exists. Returns the config of the
    float32 reference (float32, clipped as the workload asks).
    """
    workload = build_workload(factory, seed=seed, device=device)
    AmpRuntime(AmpConfig(fp32_modules=tuple(sorted(islands))), device=device).prepare(
        workload.model)
    amp = AmpRuntime(AmpConfig(dtype="float32"), device=device)
    batch = to_device(next(iter(workload.batches)), device)
    try:
        if workload.step is None:
            inputs, targets = batch
            check_loss(workload.loss_fn(workload.model(inputs), targets))
        loss = step_function(workload)(workload, batch, amp)
    except UsageError:
        raise
    except Exception as exc:  # the user's model, loss or step: theirs to fix
        raise UsageError(f"the first float32 training step failed: {one_line(exc)}") from None
    check_loss(loss)
    if workload.step is not None and amp.steps == 0:
        raise UsageError(
            "the step function never called amp.step(optimizer): call amp.backward(loss) "
            "and amp.step(optimizer) so the scaler and clipping run"
        )
    return AmpConfig(dtype="float32", clip_norm=workload.clip_norm)


def step_function(workload: Workload) -> Callable[[Workload, Any, AmpRuntime], torch.Tensor]:
    if workload.step is not None:
        user_step = workload.step
        return lambda w, batch, amp: user_step(w.model, batch, amp)
    return lambda w, batch, amp: amp.train_step(w.model, w.optimizer, w.loss_fn, batch)


def forever(batches: Any) -> Iterator[Any]:
    while True:
        yield from batches


def _judge_window(record: RunRecord, workload: Workload, start: int) -> None:
    """Decide, from the window just read back, whether the run has gone non-finite."""
    losses, scales = record.losses[start:], record.scales[start:]
    bad = [start + j for j, v in enumerate(losses) if not math.isfinite(v)]
    config = record.config
    if bad and (not config.uses_scaler or len(bad) == len(losses)):
        # With a scaler, an occasional inf loss is only a skipped step; a whole window of
        # them is an overflow no scale can reach. Without a scaler, inf/NaN reaches the
        # weights on the very step it appears.
        first = bad[0]
        if not _parameters_finite(workload.model):
            _prune(record, "parameters",
                   f"weights became non-finite by step {first}: an optimizer step applied "
                   "inf/NaN gradients (try clipping or a lower learning rate)")
            return
        finite = [v for v in record.losses[:first] if math.isfinite(v)]
        if len(finite) > _policy.SMOOTHING_STEPS and max(finite[-_policy.SMOOTHING_STEPS:]) > (
            10 * finite[0]
        ):
            _prune(record, "diverged",
                   f"the loss grew from {finite[0]:.4g} to {finite[-1]:.4g} and was "
                   f"{record.losses[first]} at step {first} (exploding gradients: try clipping)")
            return
        where = "float16" if config.dtype == "float16" else config.dtype
        _prune(record, "forward",
               f"forward overflow: the loss is {record.losses[first]} at step {first} with "
               f"finite weights; activations exceed {where}'s range before any loss scale "
               "applies, so no scaler setting fixes it (use bfloat16, or keep the "
               "overflowing module in float32)")
        return
    if not config.uses_scaler:
        return
    low = min(scales)
    if low < _policy.SCALE_FLOOR:
        step = start + scales.index(low)
        _prune(record, "scale-collapse",
               f"scale collapse: the loss scale fell to {low:.3g} by step {step}, below "
               "2**-24; gradients are non-finite at every scale, which points to an overflow "
               "in the forward pass")
        return
    streak = _trailing_skip_streak(record)
    if streak >= _policy.MAX_CONSECUTIVE_SKIPS:
        last = record.steps_run - 1
        _prune(record, "gradients",
               f"gradients non-finite on every step from step {last - streak + 1} to {last} "
               f"({streak} skipped in a row); the scaler backed off to {scales[-1]:.3g} "
               "without recovering")


def _trailing_skip_streak(record: RunRecord) -> int:
    skipped = set(record.skipped)
    streak = 0
    for i in range(record.steps_run - 1, -1, -1):
        if i not in skipped:
            break
        streak += 1
    return streak


def _parameters_finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def _prune(record: RunRecord, kind: str, reason: str) -> None:
    record.prune_kind = kind
    record.prune_reason = reason
