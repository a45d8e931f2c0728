"""Recording the gradient trace along the float32 reference (:class:`~scalertune._replay._trace.Trace`).

Hooks on every leaf module's output catch the gradient flowing into it during backward; the
parameter gradients are read when backward ends (an autograd callback queued from the first
hook), before any clipping or optimizer step touches them. Each step's largest magnitudes go
into a device buffer, read back with the training loop's own window: no host sync per step.
One step in ``TRACE_SAMPLE_EVERY`` also histograms the gradient exponents (the float32 bits,
one shift and one count per tensor) and records each module's largest forward output.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from scalertune import _policy
from scalertune._replay._trace import HIST_BINS, HIST_LOW, Trace, empty
from scalertune._workload._contract import Workload

_ENGINE = torch.autograd.Variable._execution_engine  # noqa: SLF001 - autograd's callback queue


class TraceCollector:
    """A :class:`~scalertune._run._loop.Watcher` that records a run's gradient trace."""

    def __init__(self, horizon: int = 0) -> None:
        unit = _policy.READBACK_INTERVAL
        self.block = max(unit, round(horizon / _policy.TRACE_BLOCKS / unit) * unit)
        self.trace = empty()
        self._handles: list[Any] = []

    # -- the Watcher protocol -----------------------------------------------------------------

    def attach(self, workload: Workload) -> None:
        model = workload.model
        leaves = [(n, m) for n, m in model.named_modules() if next(m.children(), None) is None]
        self._names = tuple(n or "(model)" for n, _ in leaves)
        if not self.trace.modules:
            self.trace = empty(self._names)
        self._params = [p for p in model.parameters() if p.requires_grad]
        device = self._params[0].device
        self._buffer = torch.zeros((_policy.READBACK_INTERVAL, 2), device=device)
        self._forward = torch.zeros(len(leaves), device=device)
        self._parts: list[torch.Tensor] = []
        self._sampled: list[torch.Tensor] = []
        self._hist = torch.zeros(HIST_BINS, dtype=torch.int64, device=device)
        self._queued, self._step, self._row = False, 0, 0
        self._block_hist = np.zeros(HIST_BINS, np.int64)
        self._block_forward = np.zeros(len(leaves), np.float32)
        self._handles = [m.register_forward_hook(self._on_output(i))
                         for i, (_, m) in enumerate(leaves)]

    def after_step(self, index: int) -> None:
        self._step = index + 1

    def read_window(self, start: int, end: int) -> None:
        rows = self._buffer[:end - start].cpu().numpy()
        self.trace.amax = np.concatenate([self.trace.amax, rows.max(axis=1)])
        self.trace.param_amax = np.concatenate([self.trace.param_amax, rows[:, 1]])
        self._buffer.zero_()
        self._row = 0
        hist, forward = self._hist.cpu().numpy(), self._forward.cpu().numpy()
        self._block_hist += hist
        np.maximum(self._block_forward, forward, out=self._block_forward)
        self._hist.zero_()
        self._forward.zero_()
        if end % self.block == 0:
            self._close_block(end - self.block)

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def state(self) -> dict[str, Any]:
        return {"trace": self.trace.encode(), "block": self.block}

    def restore(self, state: dict[str, Any]) -> None:
        self.trace, self.block = Trace.decode(state["trace"]), state["block"]

    def result(self) -> Trace:
        """The trace so far, its last (partial) block closed."""
        trace = self.trace
        pending = int(trace.block_starts[-1]) + self.block if len(trace.block_starts) else 0
        if pending < trace.steps:
            self._close_block(pending)
        return trace

    # -- hooks ------------------------------------------------------------------------------

    def _sampling(self) -> bool:
        return self._step % _policy.TRACE_SAMPLE_EVERY == 0

    def _on_output(self, index: int) -> Any:
        def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            for tensor in _tensors(output):
                if self._sampling():
                    peak = tensor.detach().abs().amax().float()
                    self._forward[index] = torch.maximum(self._forward[index], peak)
                tensor.register_hook(self._on_grad)
        return hook

    def _on_grad(self, grad: torch.Tensor) -> None:
        if not self._queued:
            self._queued = True
            _ENGINE.queue_callback(self._backward_done)
        self._parts.extend(torch.aminmax(grad.detach()))
        if self._sampling():
            self._sampled.append(grad.detach())

    def _backward_done(self) -> None:
        """Backward has accumulated every gradient: the step's row of the trace."""
        self._queued = False
        grads = [p.grad for p in self._params if p.grad is not None]
        param = _largest(grads) if grads else self._buffer.new_zeros(())
        act = torch.stack(self._parts).abs().max() if self._parts else self._buffer.new_zeros(())
        self._buffer[self._row % len(self._buffer), 0] = act
        self._buffer[self._row % len(self._buffer), 1] = param
        self._row += 1
        if self._sampling():
            for tensor in [*grads, *self._sampled]:
                self._hist += _exponent_counts(tensor)
        self._parts, self._sampled = [], []

    def _close_block(self, start: int) -> None:
        trace = self.trace
        trace.block_starts = np.append(trace.block_starts, start)
        trace.hist = np.vstack([trace.hist, self._block_hist])
        trace.forward = np.vstack([trace.forward, self._block_forward])
        self._block_hist = np.zeros_like(self._block_hist)
        self._block_forward = np.zeros_like(self._block_forward)


def _largest(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The largest magnitude over ``tensors`` (NaN if any holds one), on their device: one
    fused kernel on CUDA; on a CPU, where that kernel is several times slower, one min-max
    pass per tensor."""
    if tensors[0].device.type == "cuda":
        return torch.stack(torch._foreach_norm(tensors, float("inf"))).max().float()
    return torch.stack([x for g in tensors for x in torch.aminmax(g.detach())]).abs().max()


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
    """Counts per bin of ``floor(log2 |x|)`` over ``tensor``'s values, read off the float32
    exponent bits (biased exponent 0 is zero or a float32 subnormal, 255 inf/NaN)."""
    bits = tensor.detach().float().reshape(-1).view(torch.int32)
    biased = torch.bitwise_and(torch.bitwise_right_shift(bits, 23), 255)
    counts = torch.bincount(biased, minlength=256)
    out = torch.zeros(HIST_BINS, dtype=torch.int64, device=tensor.device)
    out[0], out[1] = counts[0], counts[255]
    out[2 + (1 - 127) - HIST_LOW:2 + (254 - 127) - HIST_LOW + 1] = counts[1:255]
    return out
