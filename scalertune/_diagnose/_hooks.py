"""The hooks a diagnosis puts on every module: outputs, the gradients into them, their
parameters'."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from scalertune._amp._islands import _to_float32
from scalertune._diagnose._report import ModuleReport, TensorStats, _Run


class _Hooks:
    """Forward hooks on every module (and gradient hooks on their outputs) for one run."""

    def __init__(
        self,
        model: torch.nn.Module,
        dtype: str,
        record: _Run,
        table: dict[str, ModuleReport] | None,
        *,
        grads: bool,
        repair: bool,
        device_type: str,
    ) -> None:
        self.dtype, self.record, self.table = dtype, record, table
        self.grads, self.repair, self.device_type = grads, repair, device_type
        record.watched = True
        self._below: list[bool] = []  # per running module: did a submodule overflow?
        self._handles = []
        for name, module in model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._enter))
            self._handles.append(
                module.register_forward_hook(self._leave(name), with_kwargs=True, always_call=True)
            )

    def _enter(self, _module: torch.nn.Module, _args: Any) -> None:
        self._below.append(False)

    def _leave(self, name: str) -> Callable[..., Any]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> Any:
            below = self._below.pop() if self._below else False
            tensors = list(_tensors(output))
            if self.table is not None:
                row = _row(self.table, name, module)  # rows in execution order
                if self.dtype != "float32":  # float32's forward is not in the table
                    stats = row.forward.setdefault(self.dtype, TensorStats())
                    for t in tensors:
                        stats.add(t)
            mine = False
            if any(_overflowed(t) for t in tensors):
                self.record.forward_overflow = True
                if self.record.first_forward is None:
                    self.record.first_forward = name
                    self.record.first_bad = self.record.first_bad or (
                        f"the output of {name or '(model)'}"
                    )
                mine = not below and not any(_overflowed(t) for t in _tensors((args, kwargs)))
                if mine and name not in self.record.culprits:
                    self.record.culprits.append(name)
            if self._below:
                self._below[-1] = self._below[-1] or below or mine
            repaired = None
            if mine and self.repair and not any(True for _ in module.children()):
                repaired = self._recompute(module, args, kwargs)
                if repaired is not None:
                    self.record.repaired += 1
                    output = repaired
            if self.grads:
                for t in _tensors(output):
                    if t.requires_grad and t.dim() > 0:  # a scalar is a loss: d loss/d loss
                        t.register_hook(self._on_grad(name))
            return repaired

        return hook

    def _recompute(self, module: torch.nn.Module, args: Any, kwargs: Any) -> Any:
        """The module's output computed in float32, as an island would (its own ``forward``,
        so no hook fires twice), or ``None`` if it does not recompute cleanly."""
        try:
            with torch.autocast(self.device_type, enabled=False):
                out = module.forward(*_to_float32(args), **_to_float32(kwargs))
        except Exception:  # the next round keeps it in float32 instead
            return None
        return None if any(_overflowed(t) for t in _tensors(out)) else out

    def _on_grad(self, name: str) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if self.table is not None:
                self.table[name].backward.setdefault(self.dtype, TensorStats()).add(grad)
            if self.record.first_backward is None and not bool(torch.isfinite(grad).all()):
                self.record.first_backward = name

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _row(table: dict[str, ModuleReport], name: str, module: torch.nn.Module) -> ModuleReport:
    if name not in table:
        table[name] = ModuleReport(name, type(module).__name__)
    return table[name]


def _overflowed(t: torch.Tensor) -> bool:
    """NaN or +inf, or -inf in a tensor that carries a gradient (without one: a mask)."""
    if bool(torch.isfinite(t).all()):
        return False
    return t.requires_grad or bool(torch.isnan(t).any()) or bool((t == math.inf).any())


def _sample(t: torch.Tensor, limit: int = 100_000) -> torch.Tensor:
    """Up to ``limit`` values of ``t``, evenly strided: enough for a share, and bounded. The
    same stride for the same shape, so float16's and float32's samples pair up."""
    flat = t.detach().float().abs().flatten()
    return flat[:: max(1, flat.numel() // limit)].cpu()


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, Mapping):
        for o in obj.values():
            yield from _tensors(o)
