"""Run one configuration on a fresh workload and watch it for non-finite values.

The AMP loop never waits for the device. Each step copies its loss and the current loss scale
into preallocated device buffers; every ``READBACK_INTERVAL`` steps one transfer brings the
window to the host, where it is checked, reported and timed. On CUDA that transfer is the
synchronisation point, so the window's wall time covers exactly the work of its steps. On a
CPU the two values are read as each step ends (:class:`Readings`).

After each window a stop rule (:mod:`scalertune._judge._stopping`) may end the run early: it has
reached the float32 target, or it can no longer beat the best run found so far.

A :class:`Plan` says where a run starts and what it keeps: a branch starts from a float32
checkpoint with its scaler where that config's scaler would be by then; the float32 reference
saves checkpoints at the phases of the horizon and records a gradient trace (a watcher whose
per-step work stays on the device, read back with the window).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._amp._runtime import AmpRuntime
from scalertune._errors import UsageError
from scalertune._run import _ranks
from scalertune._run._checkpoint import BatchCursor, load_checkpoint, save_checkpoint
from scalertune._run._checkpoint_file import restoring
from scalertune._run._memory import release_memory
from scalertune._run._nonfinite import judge_window
from scalertune._run._record import RunRecord, StopRule, WindowCallback
from scalertune._workload._contract import Workload, to_device
from scalertune._workload._factory import build_workload


class Watcher(Protocol):
    """What a run may record beside its loss: per step on the device, per window on the host;
    its ``state()`` goes into the run's checkpoints, so that a resumed run continues it.
    ``probe`` looks at a run's start before it trains, on an instance of the workload of its
    own (the run's instance trains each of its batches once, from its first)."""

    def probe(self, workload: Workload, step: Callable[..., Any]) -> None: ...
    def attach(
        self, workload: Workload, step: Callable[..., Any], start: int, amp: AmpRuntime
    ) -> None: ...
    def after_step(self, index: int) -> None: ...
    def read_window(self, start: int, end: int) -> None: ...
    def detach(self) -> None: ...
    def state(self) -> dict[str, Any]: ...
    def restore(self, state: dict[str, Any]) -> None: ...
    def result(self) -> Any: ...


@dataclasses.dataclass
class Plan:
    """Where a run starts and what it keeps besides its record."""

    #: A checkpoint to start from: a branch from the float32 reference, or (``resume``) the
    #: same run continuing (the reference after an interruption, a run from step 0 past its
    #: middle window), its record, watcher and scaler included.
    checkpoint: str | None = None
    resume: bool = False
    #: Step -> where to save a checkpoint once that many steps are done (a file, or a
    #: target in the study's artifact store; a ``SaveSchedule`` saves every few minutes too).
    save_at: Mapping[int, Any] = dataclasses.field(default_factory=dict)
    #: GradScaler state to start from (``scale``, ``_growth_tracker``), instead of init_scale.
    scaler: Mapping[str, float] | None = None
    watcher: Watcher | None = None


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
    plan: Plan | None = None,
) -> RunRecord:
    """Train a fresh workload under ``config`` until step ``steps`` of its training.

    The run stops early when it goes non-finite (it is pruned, with the reason) or when
    ``stop(record)`` says so after a window. ``on_window(record, first_step_of_window)`` is
    called after each window has been read back and judged (reporting lives there).
    ``prune=False`` records why the run would have been pruned but trains to the end (what a
    search without pruning would cost; ``benchmarks/pruning.py`` compares the two).
    """
    if plan is not None and plan.watcher is not None and plan.checkpoint is None:
        _probe(factory, plan.watcher, seed=seed, device=device)
    workload = build_workload(factory, seed=seed, device=device)
    size = _size(workload)
    try:
        record = train(
            workload,
            config,
            steps=steps,
            seed=seed,
            device=device,
            on_window=on_window,
            stop=stop,
            prune=prune,
            plan=plan,
        )
    finally:
        del workload
        release_memory(size)
    return record


def _size(workload: Workload) -> int:
    return sum(p.numel() * p.element_size() for p in workload.model.parameters())


def _probe(
    factory: Callable[[], Any], watcher: Watcher, *, seed: int, device: torch.device
) -> None:
    """The watcher's look at the start (the trace's start-up probe: the first batches at the
    initial weights, nothing applied) on a fresh instance of the workload, built, probed
    and let go before the run's own is built. The user's step may keep state (a counter
    for its learning rate, say): one instance, one run, each batch once, in order, so the
    probe's steps are never the run's."""
    workload = build_workload(factory, seed=seed, device=device)
    size = _size(workload)
    try:
        watcher.probe(workload, step_function(workload))
    finally:
        del workload
        release_memory(size)


def train(
    workload: Workload,
    config: AmpConfig,
    *,
    steps: int,
    seed: int,
    device: torch.device,
    on_window: WindowCallback | None = None,
    stop: StopRule | None = None,
    prune: bool = True,
    plan: Plan | None = None,
) -> RunRecord:
    """The training loop of :func:`run_config`, on a workload already built."""
    plan = plan or Plan()
    amp = AmpRuntime(config, device=device)
    amp.prepare(workload.model)
    batches = BatchCursor(workload.batches, saves=bool(plan.save_at))
    start, record = _start(workload, batches, config, seed, steps, plan, amp)
    step_fn, watcher = step_function(workload), plan.watcher
    if watcher is not None:
        watcher.attach(workload, step_fn, start, amp)
    workload.model.train()
    readings = Readings(device, steps - start, scaled=config.uses_scaler)
    every = _policy.READBACK_INTERVAL
    try:
        window_start, started = 0, time.perf_counter()
        for i in range(steps - start):
            readings.add(i, step_fn(workload, to_device(next(batches), device), amp), amp)
            if watcher is not None:
                watcher.after_step(start + i)
            if (i + 1) % every and i + 1 < steps - start:
                continue
            _read_back(record, readings, window_start, i + 1, started, amp)
            if watcher is not None:
                watcher.read_window(start + window_start, start + i + 1)
            if not record.pruned:
                judge_window(record, workload, len(record.losses) - (i + 1 - window_start))
            stopping = stop is not None and not record.pruned and stop(record)
            if on_window is not None:
                on_window(record, len(record.losses) - (i + 1 - window_start))
            if stopping or (record.pruned and prune):
                break
            if start + i + 1 in plan.save_at:
                save_checkpoint(
                    plan.save_at[start + i + 1],
                    workload,
                    batches,
                    step=start + i + 1,
                    extra={
                        "record": record.to_dict(),
                        "amp": amp.state_dict(),
                        "watcher": None if watcher is None else watcher.state(),
                    },
                )
            window_start, started = i + 1, time.perf_counter()
    finally:
        if watcher is not None:
            watcher.detach()
    if watcher is not None:
        record.trace = watcher.result()
    return record


def _start(
    workload: Workload,
    batches: BatchCursor,
    config: AmpConfig,
    seed: int,
    steps: int,
    plan: Plan,
    amp: AmpRuntime,
) -> tuple[int, RunRecord]:
    """The step a run starts at and the record it starts with; the workload and ``batches``
    put where the plan's checkpoint left them, if it has one."""
    checkpoint = plan.checkpoint
    saved = load_checkpoint(checkpoint, workload, batches) if checkpoint else None
    start = saved["step"] if saved else 0
    # a resumed run's record, scaler and watcher come from the file too
    with restoring(checkpoint) if checkpoint and plan.resume else contextlib.nullcontext():
        return start, _record(config, seed, steps, start, plan, amp, saved)


def _record(
    config: AmpConfig,
    seed: int,
    steps: int,
    start: int,
    plan: Plan,
    amp: AmpRuntime,
    saved: dict[str, Any] | None,
) -> RunRecord:
    """The record a run starts with: the steps before its checkpoint when it resumes (and its
    watcher where it was); empty otherwise, with the scaler where the plan puts it."""
    if plan.resume and saved is not None:
        if plan.watcher is not None and saved["extra"].get("watcher") is not None:
            plan.watcher.restore(saved["extra"]["watcher"])
        if saved["extra"].get("amp") is not None:  # the scaler where the run left it
            amp.load_state_dict(saved["extra"]["amp"])
        return dataclasses.replace(RunRecord.from_dict(saved["extra"]["record"]), steps=steps)
    record = RunRecord(config=config, seed=seed, steps=steps, start=start)
    if plan.scaler is not None and config.uses_scaler:
        amp.scaler.load_state_dict({**amp.scaler.state_dict(), **plan.scaler})
        record.initial_scale = float(plan.scaler["scale"])
    return record


#: Device types whose values :class:`Readings` reads as each step ends (the device is the
#: host); ``benchmarks/overhead.py`` empties it to count the syncs an accelerator would see.
HOST_READS = ("cpu",)


class Readings:
    """Each step's loss and loss scale, brought to the host once per window.

    On an accelerator both are copied, per step, into buffers made before the first step
    (through views made once: indexing a tensor costs more than the copy; GradScaler updates
    its scale in place), and one transfer per window reads them: the window's one host sync.
    Keeping each step's loss tensor instead would keep allocations made mid-step alive across
    steps. On a CPU the device is the host: ``item()`` waits for nothing and costs less than
    the copy, so the values are read as they come. A run without a scaler has a scale of 1.
    """

    def __init__(self, device: torch.device, steps: int, *, scaled: bool) -> None:
        self._host, self._scaled = device.type in HOST_READS, scaled
        self._losses: list[float] = []
        self._scales: list[float] = []
        if not self._host:
            self._buffers = torch.empty(
                (2 if scaled else 1, steps), dtype=torch.float32, device=device
            )
            self._loss_slots = self._buffers[0].unbind()
            self._scale_slots = self._buffers[1:].flatten().unbind()

    def add(self, index: int, loss: torch.Tensor, amp: AmpRuntime) -> None:
        if self._host:
            self._losses.append(loss.item())
            if self._scaled:
                self._scales.append(amp.scale.item())
            return
        self._loss_slots[index].copy_(loss)
        if self._scaled:
            self._scale_slots[index].copy_(amp.scale)

    def window(self, first: int, end: int) -> tuple[list[float], list[float]]:
        """The losses and scales of steps ``first`` to ``end`` (indices of this run)."""
        if self._host:
            losses, scales = self._losses, self._scales
            self._losses, self._scales = [], []
        else:
            rows = self._buffers[:, first:end].cpu().tolist()
            losses, scales = rows[0], rows[1] if self._scaled else []
        return losses, scales if self._scaled else [1.0] * len(losses)


def _read_back(
    record: RunRecord, readings: Readings, first: int, end: int, started: float, amp: AmpRuntime
) -> None:
    """Bring one window's losses and scales to the host (see :class:`Readings`); with ranks,
    the losses of the global batch, once the ranks agree on the scaler (:mod:`._ranks`)."""
    losses, scales = readings.window(first, end)
    record.window_step_times.append((time.perf_counter() - started) / (end - first))
    if _ranks.world() > 1:
        losses = _ranks.agree(losses, scales, amp.skipped_steps, len(record.losses))
    record.losses.extend(losses)
    record.scales.extend(scales)


def step_function(workload: Workload) -> Callable[[Workload, Any, AmpRuntime], torch.Tensor]:
    """One step on a batch already on the device; returns the loss, detached (a kept loss
    must not keep its graph)."""
    if workload.step is not None:
        user_step = workload.step
        return lambda w, batch, amp: user_step(w.model, batch, amp).detach()
    model, optimizer, loss_fn = workload.model, workload.optimizer, loss_function(workload)
    return lambda w, batch, amp: amp.train_step(model, optimizer, loss_fn, batch)


def loss_function(workload: Workload) -> Callable[[Any, Any], torch.Tensor]:
    """The ``loss_fn`` of a workload without a ``step`` of its own (the contract asks for one
    or the other)."""
    if workload.loss_fn is None:
        raise UsageError("the factory's result has neither 'loss_fn' nor 'step': give one")
    return workload.loss_fn
