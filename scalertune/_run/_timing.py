"""Step time per dtype, measured interleaved: what turns steps to target into time to target.

A config's speed is its steps to target times the time of one of its steps. The knobs of the
scaler do not change what a step computes; the dtype does (and, much less, clipping and
float32 islands). So the step time of each dtype the study can run is measured once, on the
same device, right after the float32 reference: one read-back window per dtype in turn (float32,
bfloat16, float16, float32, ...), for ``TIMING_ROUNDS`` rounds after ``TIMING_WARMUP_STEPS`` untimed
steps of each. Windows next to each other see the same load on the machine, so each round's ratio to
float32 cancels it, and the spread of the ratios over the rounds is the noise every speed claim
carries.

The timing runs on a fresh workload with every learning rate held at 0: each step computes
all it computes in training (forward, backward, clipping, the optimizer's update) but the
weights stay where they start. A model trained on, or blown up by a dtype that diverges, can
compute on values (subnormals on a CPU, inf/NaN) whose arithmetic is slower or faster than a
run's; held still, every dtype is timed on the same healthy weights.

On CUDA each window ends with one read-back from the device, which is the synchronisation
point: the window's wall time covers exactly its steps.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._amp._runtime import AmpRuntime
from scalertune._run._checkpoint import BatchCursor
from scalertune._run._schedules import kept_schedules
from scalertune._run._step_times import StepTimes
from scalertune._workload._contract import Workload, to_device


def timing_config(dtype: str, clip_norm: float | None) -> AmpConfig:
    """The config a dtype is timed with: the workload's own clipping; for float16 the
    smallest scale, never grown, so that its gradients do not overflow: a skipped step skips
    the optimizer too and is cheaper than a real one. (Gradients that flush to zero at that
    scale cost the same to compute.)"""
    if dtype == "float16":
        return AmpConfig(init_scale=_policy.SCALE_FLOOR, growth_interval=2**30, clip_norm=clip_norm)
    return AmpConfig(dtype=dtype, clip_norm=clip_norm)


def time_dtypes(
    workload: Workload,
    dtypes: Sequence[str],
    *,
    device: torch.device,
    clip_norm: float | None,
    announce: Callable[[str], None] | None = None,
) -> StepTimes:
    """Interleaved step timing of ``dtypes`` (float32 always included) on ``workload``.

    Windows where float16 skipped a step, or a dtype raised (a kernel with no half-precision
    implementation on this device), are left out; a dtype that raised every time is left
    out of the result, and its trials fail on their own. ``announce(dtype)`` is called before
    each window (an isolated process says which dtype was running if it dies).
    """
    from scalertune._run._loop import step_function

    order = ["float32", *[d for d in dict.fromkeys(dtypes) if d != "float32"]]
    runtimes = {d: AmpRuntime(timing_config(d, clip_norm), device=device) for d in order}
    for amp in runtimes.values():  # a step of the workload's own may not prepare the model
        amp.prepare(workload.model)  # (float8's conversion is the float8 runtime's forward)
    step = step_function(workload)
    batches = BatchCursor(workload.batches, saves=False)
    n = _policy.READBACK_INTERVAL
    buffer = torch.empty(n, dtype=torch.float32, device=device)
    windows: dict[str, list[tuple[float, bool]]] = {d: [] for d in order}
    broken: dict[str, str] = {}  # dtype -> why its steps raised
    steps = 0
    workload.model.train()
    loads = [_load_per_core(device)]
    with _learning_rate_zero(workload.optimizer):
        for r in range(1 + _policy.TIMING_ROUNDS):  # round 0 warms up, untimed
            steps += _round(r, runtimes, workload, step, batches, buffer, windows, broken, announce)
    loads.append(_load_per_core(device))
    if "float32" in broken:
        raise RuntimeError(f"float32 steps could not be timed: {broken['float32']}")
    seen = [x for x in loads if x is not None]
    return StepTimes(
        {d: _per_round(w) for d, w in windows.items() if d not in broken},
        steps=steps,
        load=max(seen) if seen else None,
        threads=torch.get_num_threads() if device.type == "cpu" else None,
    )


def _load_per_core(device: torch.device) -> float | None:
    """The CPU's 1-minute load average over the cores this process may run on, where the
    timing runs on the CPU and the system says (``None`` elsewhere)."""
    if device.type != "cpu" or not hasattr(os, "getloadavg"):
        return None
    try:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        return round(os.getloadavg()[0] / (cores or os.cpu_count() or 1), 3)
    except OSError:
        return None


def _round(
    r: int,
    runtimes: dict[str, AmpRuntime],
    workload: Workload,
    step: Any,
    batches: Any,
    buffer: torch.Tensor,
    windows: dict[str, list[tuple[float, bool]]],
    broken: dict[str, str],
    announce: Callable[[str], None] | None,
) -> int:
    """One window per dtype, timed from its first step to its read-back (round 0: the
    untimed warm-up, ``TIMING_WARMUP_STEPS`` steps of each); returns the steps it trained.
    Each window leaves the schedules where they were: a timing of many windows must not run
    a schedule past its length."""
    device, steps = buffer.device, 0
    n = _policy.TIMING_WARMUP_STEPS if r == 0 else len(buffer)
    for dtype, amp in runtimes.items():
        if dtype in broken:
            continue
        if announce is not None:
            announce(dtype)
        skipped_before = amp.skipped_on_device  # no sync
        started = time.perf_counter()
        try:
            with kept_schedules(workload):
                for i in range(n):
                    buffer[i] = step(workload, to_device(next(batches), device), amp).detach()
        except Exception as exc:  # noqa: BLE001 - the dtype cannot run here; its trials say why
            text = str(exc).strip().splitlines()
            broken[dtype] = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
            continue
        finite, skipped = torch.stack(
            (
                torch.isfinite(buffer[:n]).all().double(),
                (amp.skipped_on_device - skipped_before).double(),
            )
        ).tolist()  # the window's one read-back, and its end on CUDA
        elapsed = time.perf_counter() - started
        steps += n
        if not finite and not amp.config.uses_scaler:
            _repair(workload)
        if r > 0:
            windows[dtype].append((elapsed / n, not skipped))
    return steps


@contextlib.contextmanager
def _learning_rate_zero(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Every parameter group's learning rate at 0 for the timing, then back: the optimizer
    computes its whole update, which moves nothing."""
    saved = [group.get("lr") for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        if "lr" in group:
            group["lr"] = group["lr"] * 0  # a float stays a float, a tensor a tensor
    try:
        yield
    finally:
        for group, lr in zip(optimizer.param_groups, saved):
            if lr is not None:
                group["lr"] = lr


def _per_round(windows: list[tuple[float, bool]]) -> list[float]:
    """One time per round. A float16 window with a skipped step skipped its optimizer step
    too, and is cheaper than a real one: it counts at the median of the clean windows."""
    clean = [t for t, ok in windows if ok]
    if not clean:
        return [t for t, _ in windows]
    middle = statistics.median(clean)
    return [t if ok else middle for t, ok in windows]


def _repair(workload: Workload) -> None:
    """Replace non-finite weights and optimizer state with zeros: a dtype that diverged
    without a scaler must not leave the next dtype's windows computing on inf/NaN."""
    with torch.no_grad():
        for p in workload.model.parameters():
            torch.nan_to_num_(p, nan=0.0, posinf=0.0, neginf=0.0)
        for state in workload.optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    torch.nan_to_num_(value, nan=0.0, posinf=0.0, neginf=0.0)
