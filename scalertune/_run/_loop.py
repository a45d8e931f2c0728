"""Run one configuration on a fresh workload and watch it for non-finite values.

The AMP loop never waits for the device. Each step writes its loss and the current loss scale
into preallocated device buffers; every ``READBACK_INTERVAL`` steps one transfer brings the
window to the host, where it is checked, reported and timed. On CUDA that transfer is the
synchronisation point, so the window's wall time covers exactly the work of its steps.

After each window a stop rule (:mod:`scalertune._judge._stopping`) may end the run early: it has
reached the float32 target, or it can no longer beat the best run found so far.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import torch

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._amp._runtime import AmpRuntime
from scalertune._run._memory import release_memory
from scalertune._run._nonfinite import judge_window
from scalertune._run._record import RunRecord, StopRule, WindowCallback
from scalertune._workload._contract import Workload, build_workload, to_device


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
            judge_window(record, workload, window_start)
        stopping = stop is not None and not record.pruned and stop(record)
        if on_window is not None:
            on_window(record, window_start)
        if stopping or (record.pruned and prune):
            break
        window_start = i + 1
        started = time.perf_counter()
    return record


def step_function(workload: Workload) -> Callable[[Workload, Any, AmpRuntime], torch.Tensor]:
    if workload.step is not None:
        user_step = workload.step
        return lambda w, batch, amp: user_step(w.model, batch, amp)
    return lambda w, batch, amp: amp.train_step(w.model, w.optimizer, w.loss_fn, batch)


def forever(batches: Any) -> Iterator[Any]:
    while True:
        yield from batches


