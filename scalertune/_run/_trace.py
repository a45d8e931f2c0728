"""Recording the gradient trace along the float32 reference (``_replay._trace.Trace``).

Hooks on leaf modules' outputs catch the gradient flowing into each during backward; the
parameter gradients are read when backward ends (an autograd callback queued from the first
hook), before any clipping or optimizer step touches them. Each step's largest magnitudes go
into a device buffer that is read back with the training loop's own window: no host sync per
step. On *full* steps (the first ``TRACE_FULL_STEPS``, then one in ``TRACE_FULL_EVERY``, or
fewer over a horizon past ``TRACE_FULL_EVERY * TRACE_FULL_SAMPLES`` steps)
every leaf and parameter is watched, the gradient exponents are counted (off the float32 bits:
one shift and one count per tensor) and each module's largest forward output is kept; on the
others only the subset of tensors that came within ``TRACE_SUBSET_MARGIN`` of a full step's
largest, which is what keeps the reference's steps within a few percent of their cost. Of the
subset's module outputs, one whose gradient was at most another's on every full step so far
(a dropout's output and its input's, say: the same gradient, or a share of it) is left out
while that holds.

Before the first step, the start-up probe runs the first batches forward and backward at the
initial weights (no optimizer step, random state and buffers put back): what a scale too
large from the start meets while it skips.
"""

from __future__ import annotations

import base64
import functools
import itertools
from typing import Any, Callable

import numpy as np
import torch

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._replay._trace import HIST_BINS, HIST_LOW, Trace, empty
from scalertune._run._checkpoint import rng_state, set_rng_state
from scalertune._run._probe import NoStep
from scalertune._workload._contract import Workload, to_device

_ENGINE = torch.autograd.Variable._execution_engine  # noqa: SLF001 - autograd's callback queue


def _one_pass(batches: Any) -> float:
    """How many batches one pass holds (endless when it has no length)."""
    try:
        return len(batches)
    except TypeError:
        return float("inf")


def full_every(horizon: int) -> int:
    """One full step in this many after the first ``TRACE_FULL_STEPS``: ``TRACE_FULL_EVERY``,
    or fewer over a long horizon, so that a trace holds about ``TRACE_FULL_SAMPLES``."""
    return max(_policy.TRACE_FULL_EVERY, horizon // _policy.TRACE_FULL_SAMPLES)


def is_full(step: int, every: int | None = None) -> bool:
    """Whether the trace watches every tensor on ``step`` (see the module's docstring)."""
    every = _policy.TRACE_FULL_EVERY if every is None else every
    return step < _policy.TRACE_FULL_STEPS or step % every == 0


class TraceCollector:
    """A :class:`~scalertune._run._loop.Watcher` that records a run's gradient trace."""

    def __init__(self, horizon: int = 0) -> None:
        unit = _policy.READBACK_INTERVAL
        self.block = max(unit, round(horizon / _policy.TRACE_BLOCKS / unit) * unit)
        self.trace = empty()
        self._hooks = _Hooks(full_every(horizon))

    # -- the Watcher protocol -----------------------------------------------------------------

    def attach(self, workload: Workload, step: Callable[..., Any], start: int) -> None:
        self._hooks.attach(workload)
        if not self.trace.modules:
            self.trace = empty(self._hooks.names)
        self._block_hist = np.zeros(HIST_BINS, np.int64)
        self._block_forward = np.zeros(len(self._hooks.names), np.float32)
        if start == 0 and not len(self.trace.startup):
            self.trace.startup = self._probe(workload, step)
            self.trace.startup_whole = _one_pass(workload.batches) <= len(self.trace.startup)
        self._hooks.begin(start)

    def after_step(self, index: int) -> None:
        self._hooks.begin(index + 1)

    def read_window(self, start: int, end: int) -> None:
        rows, hist, forward = self._hooks.read(end - start)
        self.trace.amax = np.concatenate([self.trace.amax, rows.max(axis=1)])
        self.trace.param_amax = np.concatenate([self.trace.param_amax, rows[:, 1]])
        self._block_hist += hist
        np.maximum(self._block_forward, forward, out=self._block_forward)
        if end % self.block == 0:
            self._close_block(end - self.block)

    def detach(self) -> None:
        self._hooks.detach()

    def state(self) -> dict[str, Any]:
        return {"trace": self.trace.encode(), "block": self.block,
                "subset": self._hooks.subset.state()}

    def restore(self, state: dict[str, Any]) -> None:
        self.trace, self.block = Trace.decode(state["trace"]), state["block"]
        self._hooks.subset.restore(state["subset"])

    def result(self) -> Trace:
        """The trace so far, its last (partial) block closed."""
        trace = self.trace
        pending = int(trace.block_starts[-1]) + self.block if len(trace.block_starts) else 0
        if pending < trace.steps:
            self._close_block(pending)
        return trace

    # -- the rest -----------------------------------------------------------------------------

    def _close_block(self, start: int) -> None:
        trace = self.trace
        trace.block_starts = np.append(trace.block_starts, start)
        trace.hist = np.vstack([trace.hist, self._block_hist])
        trace.forward = np.vstack([trace.forward, self._block_forward])
        self._block_hist = np.zeros_like(self._block_hist)
        self._block_forward = np.zeros_like(self._block_forward)

    def _probe(self, workload: Workload, step: Callable[..., Any]) -> np.ndarray:
        """The largest gradient of each of the first batches at the initial weights."""
        model = workload.model
        buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
        state = rng_state()
        amp = NoStep(AmpConfig(dtype="float32"), device=self._hooks.device)
        rows = []
        try:
            for batch in itertools.islice(iter(workload.batches),
                                          _policy.STARTUP_PROBE_BATCHES):
                self._hooks.begin(0)
                step(workload, to_device(batch, self._hooks.device), amp)
                rows.append(self._hooks.read(1)[0].max())
        finally:
            workload.optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for name, value in model.named_buffers():
                    value.copy_(buffers[name])
            set_rng_state(state)
        return np.array(rows, np.float32)


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
        close = largest / _policy.TRACE_SUBSET_MARGIN
        self.modules.update(int(i) for i in np.flatnonzero(modules >= close))
        had = len(self.params)
        self.params.update(int(i) for i in np.flatnonzero(params >= close))
        self.version += len(self.params) != had
        if len(modules) <= _policy.TRACE_DOMINANCE_MODULES:
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
        dominance = None if self.dominance is None else [len(self.dominance), base64.b64encode(
            np.packbits(self.dominance).tobytes()).decode("ascii")]
        return {"modules": sorted(self.modules), "params": sorted(self.params),
                "dominance": dominance}

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
        leaves = [(n, m) for n, m in workload.model.named_modules()
                  if next(m.children(), None) is None]
        self.names = tuple(n or "(model)" for n, _ in leaves)
        self._modules = [m for _, m in leaves]
        self._params = [p for p in workload.model.parameters() if p.requires_grad]
        self.device = self._params[0].device
        n = _policy.READBACK_INTERVAL
        self._rows = torch.zeros((n, 2), device=self.device)
        self._full_rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self._hist = torch.zeros(256, dtype=torch.int64, device=self.device)  # by exponent
        self._forward = torch.zeros(len(leaves), device=self.device)
        self._row, self._full, self._queued = 0, None, False
        self._row_views = self._rows.unbind(0)  # one view per row, made once
        self._zero = torch.zeros((), device=self.device)
        self._cuda = self.device.type == "cuda"
        self._params_key: tuple[bool | None, int] | None = None
        self._chosen_params: list[torch.Tensor] = []
        self._parts: list[torch.Tensor] = []
        self._module_parts: dict[int, list[torch.Tensor]] = {}

    def begin(self, step: int) -> None:
        """Hook what step ``step`` watches: everything on a full step, the subset otherwise."""
        full = is_full(step, self._every)
        if full != self._full:
            self.detach()
            chosen = range(len(self._modules)) if full else self.subset.hooked_modules()
            self._handles = [self._modules[i].register_forward_hook(self._on_output(i))
                             for i in chosen]
            if not self._handles:  # nothing to hear backward's end from: the parameters
                self._handles.append(torch.autograd.graph.register_multi_grad_hook(
                    self._params, lambda _: self._queue(), mode="any"))
            self._full = full

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._full = [], None

    def read(self, steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of the last ``steps`` steps, the window's histogram and forward peaks (the
        one read-back per window); the subset grows by what came close on its full steps."""
        # copies: on a CPU, .cpu() is the buffer itself, which is zeroed next
        rows = self._rows[:steps].to("cpu", copy=True).numpy()
        hist = _as_hist(self._hist.to("cpu", copy=True).numpy())
        forward = self._forward.to("cpu", copy=True).numpy()
        for largest, modules, params in self._full_rows:
            self.subset.grow(float(largest), modules.cpu().numpy(), params.cpu().numpy())
        self._rows.zero_()
        self._hist.zero_()
        self._forward.zero_()
        self._row, self._full_rows = 0, []
        return rows, hist, forward

    def _on_output(self, index: int) -> Any:
        on_grad = functools.partial(self._on_grad, index)

        def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            for tensor in _tensors(output):
                if self._full:
                    peak = tensor.detach().abs().amax().float()
                    self._forward[index] = torch.maximum(self._forward[index], peak)
                tensor.register_hook(on_grad)
        return hook

    def _queue(self) -> None:
        """Have the end of this backward call :meth:`_backward_done` (once)."""
        if not self._queued:
            self._queued = True
            _ENGINE.queue_callback(self._backward_done)

    def _on_grad(self, index: int, grad: torch.Tensor) -> None:
        self._queue()
        parts = torch.aminmax(grad.detach())
        self._parts.extend(parts)
        if self._full:
            self._module_parts.setdefault(index, []).extend(parts)
            self._hist += _exponent_counts(grad)

    def _backward_done(self) -> None:
        """Backward has accumulated every gradient: the step's row of the trace (the largest
        module output gradient, the largest parameter gradient), in one stack of both sides'
        extremes, padded to two equal rows, and one reduction into the buffer."""
        self._queued = False
        grads = [p.grad for p in self._step_params() if p.grad is not None]
        row = self._row_views[self._row % len(self._row_views)]
        with torch.no_grad():  # under create_graph, backward's callbacks record too
            act, param = self._parts, _extremes(grads, self._cuda)
            width = max(len(act), len(param), 1)
            zero = self._zero
            both = torch.stack([*act, *[zero] * (width - len(act)),
                                *param, *[zero] * (width - len(param))]).float()
            torch.amax(both.view(2, width).abs(), 1, out=row)
        self._row += 1
        if self._full:
            self._record_full(grads, row.max())
        self._parts, self._module_parts = [], {}

    def _step_params(self) -> list[torch.Tensor]:
        """The parameters this step watches: all on a full step, else the subset's (the list
        kept until either changes)."""
        key = (self._full, self.subset.version)
        if key != self._params_key:
            chosen = range(len(self._params)) if self._full else sorted(self.subset.params)
            self._params_key, self._chosen_params = key, [self._params[i] for i in chosen]
        return self._chosen_params

    def _record_full(self, grads: list[torch.Tensor], largest: torch.Tensor) -> None:
        for g in grads:
            self._hist += _exponent_counts(g)
        zero = self._rows.new_zeros(())
        modules = torch.stack([torch.stack(self._module_parts[i]).abs().max()
                               if i in self._module_parts else zero
                               for i in range(len(self._modules))]) if self._modules else zero[None]
        params = torch.stack([_largest([p.grad]) if p.grad is not None else zero
                              for p in self._params])
        self._full_rows.append((largest, modules, params))


def _largest(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The largest magnitude over ``tensors`` (NaN if any holds one), on their device."""
    return torch.stack(_extremes(tensors, tensors[0].is_cuda)).abs().max().float()


def _extremes(tensors: list[torch.Tensor], cuda: bool) -> list[torch.Tensor]:
    """0-d tensors whose largest magnitude is that of ``tensors`` (NaN if any holds one; none
    for no tensors): on CUDA each one's largest magnitude, one fused kernel; on a CPU, where
    that kernel is several times slower, the minimum and maximum of them all joined (one
    copy and one pass: 41 against 73 us for GPT-2's 12 subset parameters)."""
    if not tensors:
        return []
    if cuda:
        return list(torch._foreach_norm(tensors, float("inf")))
    if len(tensors) == 1:
        return list(torch.aminmax(tensors[0].detach()))
    return list(torch.aminmax(torch.cat([g.detach().reshape(-1) for g in tensors])))


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
    return torch.bincount(torch.bitwise_and(torch.bitwise_right_shift(bits, 23), 255),
                          minlength=256)


def _as_hist(counts: np.ndarray) -> np.ndarray:
    """Per-exponent counts in the trace's histogram order: zero, inf/NaN, then the exponents
    from ``HIST_LOW`` (biased 1) up."""
    assert HIST_BINS == 256 and HIST_LOW == 1 - 127  # noqa: S101 - the layout below
    return np.concatenate([counts[:1], counts[255:], counts[1:255]])
