"""diagnose: where does float16 overflow or underflow, module by module, and what fixes it?

A few training steps of the workload run in float16 (at the loss scale asked for) and in
bfloat16, with hooks on every module's forward output and on the gradient flowing back into
it, and once in float32 for the true, unscaled gradient sizes. Then, in execution order:

- the largest magnitude each module produced, forward and backward;
- the share of its values beyond float16's limits (above 65504: overflow; below 2**-14, its
  smallest normal: lost precision, and below 2**-24 flushed to zero);
- the first module that produced inf or NaN, forward or backward.

The verdict names the cause: a forward overflow in a module (no loss scale fixes it: keep the
module in float32, or use bfloat16), gradients that overflow at this scale (a smaller scale
fixes it), gradients that underflow at this scale (a larger one fixes it), or clean.

Hooks live only inside :func:`diagnose`; a search installs none unless it diagnoses a trial it
pruned for a forward overflow.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator

import torch

from scalertune import _policy
from scalertune._config import AmpConfig
from scalertune._runtime import AmpRuntime
from scalertune._workload import build_workload, to_device


@dataclasses.dataclass
class TensorStats:
    """What one module produced, accumulated over calls and steps."""

    absmax: float = 0.0
    total: int = 0
    nonfinite: int = 0
    over: int = 0  # finite but above float16's max (only possible outside float16)
    subnormal: int = 0  # nonzero and below float16's smallest normal
    #: float32 gradients only: a sample of magnitudes, and the share that flushes at the scale
    samples: list[torch.Tensor] = dataclasses.field(default_factory=list)
    underflow_at_scale: float | None = None

    def add(self, t: torch.Tensor) -> None:
        t = t.detach()
        a = t.float().abs()
        finite = torch.isfinite(a)
        self.total += a.numel()
        self.nonfinite += int((~finite).sum())
        fa = a[finite]
        if fa.numel():
            self.absmax = max(self.absmax, float(fa.max()))
            self.over += int((fa > _policy.FLOAT16_MAX).sum())
            self.subnormal += int(((fa > 0) & (fa < _policy.FLOAT16_SMALLEST_NORMAL)).sum())

    def share(self, count: int) -> float:
        return count / self.total if self.total else 0.0


@dataclasses.dataclass
class ModuleReport:
    name: str
    kind: str
    forward: dict[str, TensorStats]
    backward: dict[str, TensorStats]


@dataclasses.dataclass
class Diagnosis:
    """The per-module evidence and the verdict of ``scalertune diagnose``.

    Example:
        >>> import scalertune
        >>> d = scalertune.diagnose("examples/attention.py:make_model")  # doctest: +SKIP
        >>> d.kind, d.islands  # doctest: +SKIP
        ('forward', ['attn.score'])
    """

    modules: list[ModuleReport]
    init_scale: float
    first_forward_nonfinite: str | None
    first_backward_nonfinite: str | None
    grad_absmax: float
    underflow_share: float
    kind: str
    verdict: str
    islands: list[str]
    suggested_init_scale: float | None

    def table(self) -> str:
        """Module by module, in execution order."""
        header = ("module", "type", "fp16 fwd max", "fp16 fwd inf/nan", "bf16 fwd max",
                  ">65504 in bf16", "grad max (fp32)", f"grad underflow @{self.init_scale:g}",
                  "fp16 grad inf/nan")
        rows = [header]
        for m in self.modules:
            f16, b16 = m.forward.get("float16"), m.forward.get("bfloat16")
            g32, g16 = m.backward.get("float32"), m.backward.get("float16")
            rows.append((
                m.name or "(model)", m.kind,
                _max(f16), _pct(f16, "nonfinite"), _max(b16), _pct(b16, "over"), _max(g32),
                _pct_value(self._underflow(g32)),
                _pct(g16, "nonfinite"),
            ))
        from scalertune._summary import format_table

        return "\n".join(format_table(rows))

    def _underflow(self, stats: TensorStats | None) -> float | None:
        return None if stats is None else stats.underflow_at_scale

    def summary(self) -> str:
        first = []
        if self.first_forward_nonfinite:
            first.append(f"first non-finite forward output: {self.first_forward_nonfinite}")
        if self.first_backward_nonfinite:
            first.append(f"first non-finite gradient: {self.first_backward_nonfinite}")
        return "\n".join([self.table(), "", *first, f"Verdict: {self.verdict}"])


def diagnose(factory_or_spec: str | Callable[[], Any], *, init_scale: float = 2.0**16,
             steps: int = _policy.DIAGNOSE_STEPS, seed: int = 0,
             device: str | torch.device = "auto") -> Diagnosis:
    """Run ``steps`` training steps in float16, bfloat16 and float32 with hooks; judge."""
    from scalertune._runtime import resolve_device
    from scalertune._workload import load_factory

    factory = (load_factory(factory_or_spec) if isinstance(factory_or_spec, str)
               else factory_or_spec)
    dev = resolve_device(device) if not isinstance(device, torch.device) else device
    order: dict[str, str] = {}
    forward: dict[str, dict[str, TensorStats]] = {}
    backward: dict[str, dict[str, TensorStats]] = {}
    first_fwd, first_bwd = _watch(factory, AmpConfig(init_scale=init_scale), steps, seed, dev,
                                  order, forward, backward)
    _watch(factory, AmpConfig(dtype="bfloat16"), steps, seed, dev, order, forward, backward)
    # float32: the true, unscaled gradients, into the modules and of the parameters
    param_grads: list[torch.Tensor] = []
    _watch(factory, AmpConfig(dtype="float32"), steps, seed, dev, order, forward, backward,
           param_grads=param_grads)
    grad_values = torch.cat(param_grads) if param_grads else torch.zeros(0)
    absmax = max((v["float32"].absmax for v in backward.values() if "float32" in v),
                 default=0.0)
    underflow = _underflow_share(grad_values, init_scale)
    for stats in backward.values():
        if "float32" in stats:
            stats["float32"].underflow_at_scale = _underflow_share(stats["float32"].samples,
                                                                   init_scale)
    modules = [ModuleReport(n, order[n], forward.get(n, {}), backward.get(n, {})) for n in order]
    kind, verdict, islands, suggested = _verdict(first_fwd, first_bwd, absmax, underflow,
                                                 init_scale, grad_values)
    return Diagnosis(modules=modules, init_scale=init_scale,
                     first_forward_nonfinite=first_fwd, first_backward_nonfinite=first_bwd,
                     grad_absmax=absmax, underflow_share=underflow, kind=kind, verdict=verdict,
                     islands=islands, suggested_init_scale=suggested)


def first_overflowing_module(factory: Callable[[], Any], config: AmpConfig, *, seed: int,
                             device: torch.device) -> str | None:
    """The first module whose forward output is non-finite under ``config`` (one step)."""
    first, _ = _watch(factory, config, 1, seed, device, {}, {}, {})
    return first


def _watch(factory: Callable[[], Any], config: AmpConfig, steps: int, seed: int,
           device: torch.device, order: dict[str, str],
           forward: dict[str, dict[str, TensorStats]],
           backward: dict[str, dict[str, TensorStats]],
           param_grads: list[torch.Tensor] | None = None) -> tuple[str | None, str | None]:
    """Train ``steps`` steps under ``config`` with hooks on every module; return the first
    modules with a non-finite output and gradient. ``param_grads``, when given, collects a
    sample of every parameter gradient after each step."""
    workload = build_workload(factory, seed=seed, device=device)
    amp = AmpRuntime(config, device=device)
    amp.prepare(workload.model)
    dtype = config.dtype
    first: dict[str, str | None] = {"fwd": None, "bwd": None}
    keep = dtype == "float32"  # float32 gradients are the true sizes the scale acts on
    handles = []

    def on_forward(name: str, module: torch.nn.Module) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
            order.setdefault(name, type(module).__name__)
            for t in _tensors(output):
                stats = forward.setdefault(name, {}).setdefault(dtype, TensorStats())
                stats.add(t)
                if first["fwd"] is None and not bool(torch.isfinite(t).all()):
                    first["fwd"] = name
                if t.requires_grad:
                    t.register_hook(on_backward(name))
        return hook

    def on_backward(name: str) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            stats = backward.setdefault(name, {}).setdefault(dtype, TensorStats())
            stats.add(grad)
            if keep:
                stats.samples.append(_sample(grad))
            if first["bwd"] is None and not bool(torch.isfinite(grad).all()):
                first["bwd"] = name
        return hook

    for name, module in workload.model.named_modules():
        handles.append(module.register_forward_hook(on_forward(name, module)))
    try:
        batches = _cycle(workload.batches)
        for _ in range(steps):
            batch = to_device(next(batches), device)
            if workload.step is not None:
                workload.step(workload.model, batch, amp)
            else:
                amp.train_step(workload.model, workload.optimizer, workload.loss_fn, batch)
            if param_grads is not None:  # the next step zeroes them; read them now
                param_grads += [_sample(p.grad) for p in workload.model.parameters()
                                if p.grad is not None]
    finally:
        for handle in handles:
            handle.remove()
    return first["fwd"], first["bwd"]


def _sample(t: torch.Tensor, limit: int = 100_000) -> torch.Tensor:
    """Up to ``limit`` magnitudes of ``t``, evenly strided: enough for a share, and bounded."""
    flat = t.detach().float().abs().flatten()
    return flat[:: max(1, flat.numel() // limit)].cpu()


def _underflow_share(values: Any, scale: float) -> float:
    """Share of nonzero gradient values that flush to zero in float16 at ``scale``."""
    if isinstance(values, list):
        values = torch.cat(values) if values else torch.zeros(0)
    nonzero = values[values > 0]
    if not nonzero.numel():
        return 0.0
    return float((nonzero * scale < _policy.FLOAT16_SMALLEST_SUBNORMAL / 2).float().mean())


def _verdict(first_fwd: str | None, first_bwd: str | None, grad_absmax: float,
             underflow: float, scale: float,
             grads: torch.Tensor) -> tuple[str, str, list[str], float | None]:
    if first_fwd is not None:
        return ("forward",
                f"forward overflow in module '{first_fwd}': its float16 output is inf/NaN before "
                f"any loss scale applies, so no scaler setting fixes it. Keep it in float32 "
                f"(--fp32-modules {first_fwd}) or use bfloat16.", [first_fwd], None)
    high = _power_of_two_below(_policy.FLOAT16_MAX / grad_absmax) if grad_absmax > 0 else None
    if first_bwd is not None or (high is not None and scale > high):
        where = f" (first in module '{first_bwd}')" if first_bwd else ""
        return ("gradient-overflow",
                f"gradient overflow at init_scale {scale:g}{where}: the largest float32 "
                f"gradient is {grad_absmax:.3g}, so scaled gradients exceed 65504. A smaller "
                f"scale fixes it: init_scale <= {high:g}.", [], high)
    if underflow > _policy.UNDERFLOW_SHARE:
        nonzero = grads[grads > 0]
        nonzero = nonzero[:: max(1, nonzero.numel() // 1_000_000)]  # quantile's size limit
        low = _policy.FLOAT16_SMALLEST_SUBNORMAL / float(torch.quantile(nonzero, 0.01))
        suggested = min(2.0 ** math.ceil(math.log2(low)), high or math.inf)
        return ("underflow",
                f"underflow at init_scale {scale:g}: {underflow:.0%} of the nonzero gradient "
                f"values flush to zero in float16 (the loss stays flat, with no skipped step "
                f"and no NaN). A larger scale fixes it: init_scale >= {suggested:g}.", [],
                suggested)
    return ("clean", f"clean at init_scale {scale:g}: nothing overflows or underflows in float16"
            + (f" (the scale could go up to {high:g})" if high else ""), [], None)


def _power_of_two_below(x: float) -> float:
    return 2.0 ** math.floor(math.log2(x)) if x > 0 else 0.0


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _cycle(batches: Any) -> Iterator[Any]:
    while True:
        yield from batches


def _max(stats: TensorStats | None) -> str:
    if stats is None:
        return "-"
    if stats.nonfinite == stats.total:
        return "inf/nan"
    return f"{stats.absmax:.3g}"


def _pct(stats: TensorStats | None, field: str) -> str:
    return "-" if stats is None else _pct_value(stats.share(getattr(stats, field)))


def _pct_value(v: float | None) -> str:
    if v is None:
        return "-"
    return "0" if v == 0 else f"{v:.1%}"
