"""Recording the gradient trace along the float32 reference (``_replay._trace.Trace``).

Hooks on leaf modules' outputs catch the gradient flowing into each during backward; the
parameter gradients are read as each ``amp.backward`` returns (a later backward of the same
step, accumulating into them, reads them again), before any clipping or optimizer step
touches them; ``amp.step`` closes the step's row. Each gradient's minimum and
maximum are written in place into a slot of a device buffer, and the slots are reduced to the
step's largest magnitudes once per window, when the training loop reads its own window back:
no host sync per step, and no reduction per step.

On *full* steps (the first ``TRACE_FULL_STEPS``, then one in ``TRACE_FULL_EVERY``, or fewer
over a horizon past ``TRACE_FULL_EVERY * TRACE_FULL_SAMPLES`` steps) every leaf and parameter
is watched, the gradient exponents are counted (off the float32 bits: one shift and one count
over the gradients joined, a few MB at a time) and each module's largest forward output is
kept; on the others only the subset of tensors that came within ``TRACE_SUBSET_MARGIN`` of a
full step's largest, which is what keeps the reference's steps within a few percent of
their cost. Of the subset's module outputs, one whose gradient was at most another's on every
full step so far (a dropout's output and its input's, say: the same gradient, or a share of
it) is left out while that holds. (Not one at most a parameter's: that order changes as the
model trains, and left out it missed the largest by up to 3x on two small workloads.)

Before the first step, the start-up probe runs the first batches forward and backward at the
initial weights (no optimizer step, random state and buffers put back): what a scale too
large from the start meets while it skips. It runs on an instance of the workload of its own
(``Watcher.probe``): the run's instance trains each batch once, from its first, so a step
that keeps state of its own (a counter for its learning rate) stays in step with the run.
"""

from __future__ import annotations

import base64
import functools
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor
from torch.utils.hooks import RemovableHandle

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._amp._runtime import AmpRuntime
from scalertune._amp._torch_private import foreach_max_norm
from scalertune._replay._trace import HIST_BINS, HIST_LOW, Trace, empty
from scalertune._run import _policy as _run_policy
from scalertune._run import _ranks
from scalertune._run._probe import NoStep
from scalertune._run._schedules import kept_schedules
from scalertune._workload._contract import Workload, to_device
from scalertune._workload._rng import rng_state, set_rng_state


def _one_pass(batches: Any) -> float:
    """How many batches one pass holds (endless when it has no length)."""
    try:
        return len(batches)
    except TypeError:
        return float("inf")


def full_every(horizon: int) -> int:
    """One full step in this many after the first ``TRACE_FULL_STEPS``: ``TRACE_FULL_EVERY``,
    or fewer over a long horizon, so that a trace holds about ``TRACE_FULL_SAMPLES``."""
    return max(_run_policy.TRACE_FULL_EVERY, horizon // _run_policy.TRACE_FULL_SAMPLES)


def is_full(step: int, every: int | None = None) -> bool:
    """Whether the trace watches every tensor on ``step`` (see the module's docstring)."""
    every = _run_policy.TRACE_FULL_EVERY if every is None else every
    return step < _run_policy.TRACE_FULL_STEPS or step % every == 0


class TraceCollector:
    """A :class:`~scalertune._run._loop.Watcher` that records a run's gradient trace."""

    def __init__(self, horizon: int = 0) -> None:
        unit = _policy.READBACK_INTERVAL
        self.block = max(unit, round(horizon / _run_policy.TRACE_BLOCKS / unit) * unit)
        self.trace = empty()
        self._hooks = _Hooks(full_every(horizon))
        # the run's runtime telling the hooks (removed when the trace detaches)
        self._heard: list[RemovableHandle] = []
        # read since the trace last took them in (see :meth:`_settled`): each window's rows,
        # each closed block's first step, histogram and forward peaks
        self._windows: list[np.ndarray] = []
        self._blocks: list[tuple[int, np.ndarray, np.ndarray]] = []

    # -- the Watcher protocol -----------------------------------------------------------------

    def probe(self, workload: Workload, step: Callable[..., Any]) -> None:
        """The start-up probe (see the module's docstring), on ``workload``: an instance of
        the run's workload of its own, which the run never trains."""
        if len(self.trace.startup):
            return
        self._hooks.attach(workload)
        try:
            if not self.trace.modules:
                self.trace = empty(self._hooks.names)
            self.trace.startup = self._probe(workload, step)
            self.trace.startup_whole = _one_pass(workload.batches) <= len(self.trace.startup)
        finally:
            self._hooks.detach()

    def attach(
        self, workload: Workload, step: Callable[..., Any], start: int, amp: AmpRuntime
    ) -> None:
        self._hooks.attach(workload)
        self._heard = _hear(amp, self._hooks)
        if not self.trace.modules:
            self.trace = empty(self._hooks.names)
        self._hooks.begin(start)

    def after_step(self, index: int) -> None:
        self._hooks.begin(index + 1)

    def read_window(self, start: int, end: int) -> None:
        self._windows.append(self._hooks.read(end - start))
        if end % self.block == 0:
            self._close_block(end - self.block)

    def detach(self) -> None:
        self._hooks.detach()
        for handle in self._heard:
            handle.remove()

    def state(self) -> dict[str, Any]:
        return {
            "trace": self._settled().encode(),
            "block": self.block,
            "subset": self._hooks.subset.state(),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.trace, self.block = Trace.decode(state["trace"]), state["block"]
        self._windows, self._blocks = [], []
        self._hooks.subset.restore(state["subset"])

    def result(self) -> Trace:
        """The trace so far, its last (partial) block closed."""
        trace = self._settled()
        pending = int(trace.block_starts[-1]) + self.block if len(trace.block_starts) else 0
        if pending < trace.steps:
            self._close_block(pending)
        return self._settled()

    # -- the rest -----------------------------------------------------------------------------

    def _close_block(self, start: int) -> None:
        self._blocks.append((start, *self._hooks.take_block()))

    def _settled(self) -> Trace:
        """The trace with what was read since last time taken in: one copy of its arrays
        per checkpoint and per result, not per window."""
        trace = self.trace
        if self._windows:
            rows = np.concatenate(self._windows)
            trace.amax = np.concatenate([trace.amax, rows.max(axis=1)])
            trace.param_amax = np.concatenate([trace.param_amax, rows[:, 1]])
        if self._blocks:
            starts, hists, forwards = zip(*self._blocks)
            trace.block_starts = np.append(trace.block_starts, starts)
            trace.hist = np.vstack([trace.hist, *hists])
            trace.forward = np.vstack([trace.forward, *forwards])
        self._windows, self._blocks = [], []
        return trace

    def _probe(self, workload: Workload, step: Callable[..., Any]) -> np.ndarray:
        """The largest gradient of each of the first batches at the initial weights (the
        workload left as it was: buffers, schedulers, learning rates, RNGs)."""
        model = workload.model
        buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
        state = rng_state()
        # the float32 reference's config, the workload's clipping in it: an engine made for
        # it (DeepSpeed's) is the one the reference trains in
        config = AmpConfig(dtype="float32", clip_norm=workload.clip_norm)
        amp = NoStep(config, device=self._hooks.device)
        _hear(amp, self._hooks)
        rows = []
        try:
            with kept_schedules(workload):
                for batch in itertools.islice(
                    iter(workload.batches), _run_policy.STARTUP_PROBE_BATCHES
                ):
                    self._hooks.begin(0)
                    step(workload, to_device(batch, self._hooks.device), amp)
                    self._hooks.flush()
                    rows.append(self._hooks.read(1).max())
        finally:
            self._hooks.take_block()  # the probe's histograms are not the run's
            workload.optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for name, value in model.named_buffers():
                    value.copy_(buffers[name])
            set_rng_state(state)
        return np.array(rows, np.float32)


def _hear(amp: AmpRuntime, hooks: _Hooks) -> list[RemovableHandle]:
    """Have ``amp.backward`` and ``amp.step`` tell ``hooks``; the handles that stop it."""
    return [amp.hooks.after_backward(hooks.backward_done), amp.hooks.before_step(hooks.grads_ready)]


class _Subset:
    """What the trace watches between full steps: the module outputs and parameters whose
    gradients came within ``TRACE_SUBSET_MARGIN`` of a full step's largest, less the module
    outputs another of them dominates (see the module's docstring)."""

    def __init__(self) -> None:
        self.modules: set[int] = set()
        self.params: set[int] = set()
        # [i, j]: module i's output gradient was at least module j's on every full step read
        # (None before the first, and over TRACE_DOMINANCE_MODULES leaves: nothing left out)
        self.dominance: np.ndarray | None = None
        self.version = 0  # counts the changes to ``params``

    def grow(self, largest: float, modules: np.ndarray, params: np.ndarray) -> None:
        """One full step's largest gradient over all, and per module output and parameter."""
        close = largest / _run_policy.TRACE_SUBSET_MARGIN
        self.modules.update(int(i) for i in np.flatnonzero(modules >= close))
        had = len(self.params)
        self.params.update(int(i) for i in np.flatnonzero(params >= close))
        self.version += len(self.params) != had
        if len(modules) <= _run_policy.TRACE_DOMINANCE_MODULES:
            at_least = modules[:, None] >= modules[None, :]
            self.dominance = at_least if self.dominance is None else self.dominance & at_least

    def hooked_modules(self) -> list[int]:
        """The subset's modules less those another of them dominates (of modules equal on
        every full step, the first)."""
        chosen = sorted(self.modules)
        if self.dominance is None or len(chosen) < 2:
            return chosen
        held = self.dominance[np.ix_(chosen, chosen)]  # [a, b]: a's at least b's, always
        first = np.arange(len(chosen))
        beaten = (held & ~held.T) | (held & held.T & (first[:, None] < first[None, :]))
        return [i for i, out in zip(chosen, beaten.any(axis=0)) if not out]

    def state(self) -> dict[str, Any]:
        dominance = (
            None
            if self.dominance is None
            else [
                len(self.dominance),
                base64.b64encode(np.packbits(self.dominance).tobytes()).decode("ascii"),
            ]
        )
        return {
            "modules": sorted(self.modules),
            "params": sorted(self.params),
            "dominance": dominance,
        }

    def restore(self, saved: dict[str, Any]) -> None:
        self.modules, self.params = set(saved["modules"]), set(saved["params"])
        self.version += 1
        if saved.get("dominance") is not None:
            n, text = saved["dominance"]
            bits = np.frombuffer(base64.b64decode(text), np.uint8)
            self.dominance = np.unpackbits(bits, count=n * n).astype(bool).reshape(n, n)


class _Hooks:
    """The hooks of a trace and the device buffers they write (see the module's docstring)."""

    def __init__(self, every: int | None = None) -> None:
        self._every = every
        self.names: tuple[str, ...] = ()
        self._modules: list[torch.nn.Module] = []
        self._handles: list[Any] = []
        self.subset = _Subset()

    def attach(self, workload: Workload) -> None:
        leaves = [
            (n, m) for n, m in workload.model.named_modules() if next(m.children(), None) is None
        ]
        self.names = tuple(n or "(model)" for n, _ in leaves)
        self._modules = [m for _, m in leaves]
        self._params = [p for p in workload.model.parameters() if p.requires_grad]
        self.device = self._params[0].device
        self._cuda = self.device.type == "cuda"
        # Per step of the window, a row of slots each side, written in place as the
        # gradients come and reduced once per window by :meth:`read`: the module output
        # gradients' extremes (a minimum and a maximum each) and the parameters' (a pair each
        # on a CPU, one largest magnitude each on CUDA, one fused kernel for them all).
        self._slots = _Slots(
            max(2 * len(leaves), (1 if self._cuda else 2) * len(self._params)), self.device
        )
        self._hist = torch.zeros(256, dtype=torch.int64, device=self.device)  # by exponent
        self._forward = torch.zeros(len(leaves), device=self.device)
        self._full_rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._owners: list[int] = []  # full steps: the module of each act slot used
        self._indices: dict[str, tuple[list[int], torch.Tensor]] = {}
        self._peaks: list[torch.Tensor] = []  # full steps: forward extremes, and their modules
        self._peak_owners: list[int] = []
        self._counted = _Counts(self._hist)
        self._row, self._used, self._pending = 0, 0, False
        self._full: bool | None = None  # which hooks are on: none yet
        self._params_read = False  # whether this step's parameters were read
        self._zero = torch.zeros((), device=self.device)
        self._params_key: tuple[bool | None, int] | None = None
        self._chosen_params: list[torch.Tensor] = []
        self._float32 = True  # whether every one of them is float32

    def begin(self, step: int) -> None:
        """Hook what step ``step`` watches: everything on a full step, the subset otherwise
        (the step before it read, if its code did not call ``amp.step``)."""
        self.flush()
        self._pending, self._params_read = True, False
        full = is_full(step, self._every)
        if full != self._full:
            self.detach()
            chosen = range(len(self._modules)) if full else self.subset.hooked_modules()
            self._handles = [
                self._modules[i].register_forward_hook(self._on_output(i)) for i in chosen
            ]
            self._full = full

    def flush(self) -> None:
        """Read the step begun if its code has not called ``amp.step`` (this time)."""
        if self._pending:
            self.grads_ready()

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._full = [], None

    def read(self, steps: int) -> np.ndarray:
        """The rows of the last ``steps`` steps (the largest module output gradient, the
        largest parameter gradient; the one read-back per window); the subset grows by what
        came close on its full steps."""
        rows, full = _over_ranks(self._slots.buffer[:steps].abs().amax(2), self._full_rows)
        for largest, modules, params in full:
            self.subset.grow(float(largest), modules.cpu().numpy(), params.cpu().numpy())
        self._slots.clear()
        self._row, self._full_rows = 0, []
        return rows

    def take_block(self) -> tuple[np.ndarray, np.ndarray]:
        """The histogram and forward peaks of the full steps since the last call (read
        once per trace block), zeroed after."""
        _ranks.reduce(self._hist, "sum"), _ranks.reduce(self._forward, "max")  # over ranks
        # copies: on a CPU, .cpu() is the buffer itself, which is zeroed next
        hist = _as_hist(self._hist.to("cpu", copy=True).numpy())
        forward = self._forward.to("cpu", copy=True).numpy()
        self._hist.zero_()
        self._forward.zero_()
        return hist, forward

    def _on_output(self, index: int) -> Any:
        on_grad = functools.partial(self._on_grad, index)

        def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            for tensor in _tensors(output):
                if self._full:  # the extremes, reduced into the peaks by grads_ready
                    self._peaks.extend(torch.aminmax(tensor.detach()))
                    self._peak_owners += (index, index)
                tensor.register_hook(on_grad)

        return hook

    def _on_grad(self, index: int, grad: torch.Tensor) -> None:
        used = self._used
        self._used = used + 2
        slots = self._slots.row(self._row, _Slots.ACT, used + 2)
        _extremes_into(grad.detach(), slots[used], slots[used + 1])
        if self._full:
            self._owners += (index, index)
            self._counted.add(grad)

    def backward_done(self) -> None:
        """``amp.backward`` has returned: the parameters' side of the step's row, from their
        gradients as this backward left them (a later backward of the same step, which
        accumulates into them, writes it again), before any clipping touches them."""
        if self._pending:
            self._read_params()
            self._params_read = True

    def grads_ready(self) -> None:
        """The step's gradients are complete (``amp.step`` calls this first; :meth:`flush`
        for a step that did not call it): its row is done, and a full step's record."""
        if not self._pending:  # a second ``amp.step`` in one step
            return
        self._pending = False
        if not self._params_read:  # a backward not through ``amp.backward``
            self._read_params()
        if self._full:
            self._record_full()
        self._row += 1
        self._used = 0

    def _read_params(self) -> None:
        """Write the watched parameters' gradient extremes into the step's slots."""
        grads = [_local(p.grad, self._zero) for p in self._step_params()]
        self._slots.write_params(self._row, grads, self._cuda, self._float32)

    def _step_params(self) -> list[torch.Tensor]:
        """The parameters this step watches: all on a full step, else the subset's (the list
        kept until either changes)."""
        key = (self._full, self.subset.version)
        if key != self._params_key:
            chosen = range(len(self._params)) if self._full else sorted(self.subset.params)
            self._params_key, self._chosen_params = key, [self._params[i] for i in chosen]
            self._float32 = all(p.dtype == torch.float32 for p in self._chosen_params)
        return self._chosen_params

    def _record_full(self) -> None:
        """A full step, every parameter watched: the histogram of the parameter gradients,
        each module output's and parameter's largest magnitude and the step's largest."""
        for p in self._params:
            if p.grad is not None:
                self._counted.add(p.grad)
        self._counted.flush()
        act, param = self._slots.buffer[self._row].abs().unbind(0)
        modules = torch.zeros(max(1, len(self._modules)), device=self.device)
        if self._owners:
            owners = self._device_index("act", self._owners)
            modules.scatter_reduce_(0, owners, act[: len(self._owners)], "amax")
        if self._peaks:
            owners = self._device_index("forward", self._peak_owners)
            peaks = torch.stack(self._peaks).float().abs()
            self._forward.scatter_reduce_(0, owners, peaks, "amax")
            self._peaks, self._peak_owners = [], []
        n = len(self._params)  # a full step watches every one
        params = param[:n] if self._cuda else param[: 2 * n].view(-1, 2).amax(1)
        self._full_rows.append((torch.maximum(act.max(), param.max()), modules, params))
        self._owners = []

    def _device_index(self, key: str, owners: list[int]) -> torch.Tensor:
        """``owners`` on the device, made again only when a full step's order changes (it
        seldom does: no copy to the device on most full steps)."""
        made = self._indices.get(key)
        if made is None or made[0] != owners:
            made = self._indices[key] = (list(owners), torch.tensor(owners, device=self.device))
        return made[1]


class _Slots:
    """Per step of a window, a row of 0-d slots on each side (0: the module output
    gradients', 1: the parameters'; see :meth:`_Hooks.attach`), made wider when a step
    needs more than they have; unused slots hold zeros."""

    ACT, PARAM = 0, 1

    def __init__(self, width: int, device: torch.device) -> None:
        self.buffer = torch.zeros((_policy.READBACK_INTERVAL, 2, max(2, width)), device=device)
        self._views = _views(self.buffer)

    def row(self, step: int, side: int, needs: int) -> tuple[torch.Tensor, ...]:
        """Row ``step``'s slots on ``side``, at least ``needs`` of them."""
        width = self.buffer.shape[2]
        if needs > width:
            wider = self.buffer.new_zeros((*self.buffer.shape[:2], 2 * needs))
            wider[..., :width] = self.buffer
            self.buffer, self._views = wider, _views(wider)
        return self._views[step][side]

    def write_params(self, step: int, grads: list[torch.Tensor], cuda: bool, float32: bool) -> None:
        """Row ``step``'s parameter slots from ``grads``: on CUDA each one's largest
        magnitude (one fused kernel), on a CPU each one's minimum and maximum."""
        if cuda and grads:
            self.row(step, _Slots.PARAM, len(grads))
            norms = foreach_max_norm(grads)  # one kernel for all
            span = self.buffer[step, _Slots.PARAM, : len(grads)]
            if float32:
                torch.stack(norms, out=span)
            else:  # out= takes only its own dtype
                span.copy_(torch.stack([n.float() for n in norms]))
        else:
            slots = self.row(step, _Slots.PARAM, 2 * len(grads))
            for k, g in enumerate(grads):
                _extremes_into(g, slots[2 * k], slots[2 * k + 1])

    def clear(self) -> None:
        self.buffer.zero_()


def _views(buffer: torch.Tensor) -> list[list[tuple[torch.Tensor, ...]]]:
    """Every slot of ``buffer`` as a 0-d view, made once per buffer: [step][side][slot]."""
    return [[side.unbind(0) for side in row.unbind(0)] for row in buffer]


def _extremes_into(tensor: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> None:
    """``tensor``'s minimum and maximum into the float32 slots ``low`` and ``high`` (NaN if
    it holds one): in place for a float32 tensor, through a copy for another dtype."""
    if tensor.dtype == torch.float32:
        torch.aminmax(tensor, out=(low, high))
    else:
        lo, hi = torch.aminmax(tensor)
        low.copy_(lo)
        high.copy_(hi)


class _Counts:
    """The exponent histogram of a full step's gradients, counted in few passes: gradients
    are held until they add up to ``most`` values (or the step ends), then joined and counted
    at once."""

    def __init__(self, into: torch.Tensor, most: int = 1 << 22) -> None:
        self._into, self._most = into, most
        self._held: list[torch.Tensor] = []
        self._size = 0

    def add(self, tensor: torch.Tensor) -> None:
        tensor = tensor.to_local() if isinstance(tensor, DTensor) else tensor  # FSDP2's shard
        self._held.append(tensor.detach().reshape(-1))
        self._size += tensor.numel()
        if self._size >= self._most:
            self.flush()

    def flush(self) -> None:
        if self._held:
            joined = (
                self._held[0]
                if len(self._held) == 1
                else torch.cat([t.float() for t in self._held])
            )
            self._into += _exponent_counts(joined)
        self._held, self._size = [], 0


def _local(grad: torch.Tensor | None, empty: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) gradient, any other as it is, detached;
    ``empty`` for none, or a shard with no element (a rank's shard of a small parameter may
    be empty)."""
    if grad is None:
        return empty
    local = grad.detach()
    local = local.to_local() if isinstance(local, DTensor) else local
    return local if local.numel() else empty


def _over_ranks(
    rows: torch.Tensor, full: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
) -> tuple[np.ndarray, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """A window's rows and its full steps' records, each the largest over the ranks (the
    same shapes on every rank: the ranks train the same steps of the same model), in one
    all-reduce; the subset each rank grows from them is then the same on every rank."""
    if _ranks.world() == 1:
        return rows.cpu().numpy(), full
    parts = [rows.flatten()] + [
        t.flatten().float() for row in full for t in (row[0].reshape(1), row[1], row[2])
    ]
    joined = _ranks.reduce(torch.cat(parts), "max")
    out, at = [], rows.numel()
    reduced_rows = joined[:at].view_as(rows)
    for largest, modules, params in full:
        shapes = [largest.reshape(1), modules, params]
        pieces = []
        for t in shapes:
            pieces.append(joined[at : at + t.numel()].view_as(t))
            at += t.numel()
        out.append((pieces[0].reshape(()), pieces[1], pieces[2]))
    return reduced_rows.cpu().numpy(), out


def _tensors(obj: Any) -> list[torch.Tensor]:
    """The floating tensors of a module's output that carry a gradient (not a scalar loss,
    whose gradient is the loss scale itself)."""
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.requires_grad and obj.is_floating_point() and obj.dim() else []
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _exponent_counts(tensor: torch.Tensor) -> torch.Tensor:
    """Counts of ``tensor``'s values per biased float32 exponent (256 bins: 0 is zero or a
    float32 subnormal, 255 inf/NaN), read off the bits: a shift, a mask and a count. The
    buffers add these up as they come; :func:`_as_hist` orders them once per window."""
    bits = tensor.detach().float().reshape(-1).view(torch.int32)
    return torch.bincount(
        torch.bitwise_and(torch.bitwise_right_shift(bits, 23), 255), minlength=256
    )


def _as_hist(counts: np.ndarray) -> np.ndarray:
    """Per-exponent counts in the trace's histogram order: zero, inf/NaN, then the exponents
    from ``HIST_LOW`` (biased 1) up."""
    assert HIST_BINS == 256 and HIST_LOW == 1 - 127  # noqa: S101 - the layout below
    return np.concatenate([counts[:1], counts[255:], counts[1:255]])
