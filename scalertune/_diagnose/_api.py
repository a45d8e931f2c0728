"""diagnose: where does float16 overflow or underflow, module by module, and what fixes it?

A diagnosis is a claim about what GradScaler will do, so diagnose checks every claim by
running it: training steps through the same :class:`~scalertune.AmpRuntime` a search uses, on
fresh workloads from the same seed, counting the optimizer steps GradScaler really let through
(a *skipped step* is one it did not). It runs

- float16 at the loss scale asked for, with hooks on every module: the module's forward
  output, the gradient flowing back into that output, and its own parameters' gradients as
  the scaled float16 backward left them (before ``unscale_``);
- while that forward overflows: the same steps with the culprit modules kept in float32
  (*float32 islands*), until the forward is finite: the advice, checked;
- bfloat16 (float32's exponent range, no scaler) and float32 (the true gradient sizes);
- for a gradient verdict, float16 at the powers of two it considers, until it finds the one
  nearest the scale asked for at which no step is skipped (overflow), or at which few enough
  gradient values flush to zero (underflow), within the tool's floors.

**The culprit** of a forward overflow is the module whose own computation turned finite
inputs into inf/NaN. Forward hooks fire child-first, so when a module's hook runs it knows
whether a submodule already did that during this call; if none did and its inputs were
finite, its own code did (``q @ k.T`` written in the parent, say). A module whose inputs
already held the overflow only passed it on. An input (or output) counts as overflowed when it
holds NaN or +inf, or -inf in a tensor that carries a gradient: -inf in a tensor without one
is an attention mask.

**Underflow** is measured, not predicted: every run starts from the same weights and batch, so
the share of parameter-gradient values that are nonzero in float32's first step and exactly
zero in float16's is the share that flushed, wherever in the backward it happened.

**The loss's own gradient** (d loss / d loss, times the scale) is not a model gradient: the
hooks skip module outputs that are scalars, which is how a model that returns its own loss
(Hugging Face's ``ModelOutput``, a dict) hands it over.

Hooks live only inside :func:`diagnose` and :func:`locate_forward_overflow`; a search installs
none unless it locates the overflow of a trial it pruned for one.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import shlex
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._amp._device import resolve_device
from scalertune._amp._islands import _to_float32
from scalertune._amp._modules import match_modules
from scalertune._amp._runtime import AmpRuntime
from scalertune._errors import UsageError
from scalertune._workload._contract import Workload, build_workload, to_device
from scalertune._workload._loader import load_factory, one_line

_FLOAT32 = AmpConfig(dtype="float32")


class TrainingFailed(Exception):
    """The workload raised while diagnose trained it: there is nothing to diagnose in that
    dtype (``nn.LSTM`` under CPU float16 autocast, say). The message says which and why."""


@dataclasses.dataclass
class TensorStats:
    """What one module produced (or received as a gradient), over calls and steps."""

    absmax: float = 0.0
    total: int = 0
    nonfinite: int = 0
    over: int = 0  # finite but above float16's max (only possible outside float16)

    def add(self, t: torch.Tensor) -> None:
        a = t.detach().float().abs()
        finite = torch.isfinite(a)
        self.total += a.numel()
        self.nonfinite += int((~finite).sum())
        fa = a[finite]
        if fa.numel():
            self.absmax = max(self.absmax, float(fa.max()))
            self.over += int((fa > _policy.FLOAT16_MAX).sum())

    def share(self, count: int) -> float:
        return count / self.total if self.total else 0.0


@dataclasses.dataclass
class ModuleReport:
    """One module's row of the table: what it did in each dtype.

    ``forward`` is its output; ``backward`` the gradient flowing into that output; ``params``
    its own parameters' gradients (float16: scaled, as the backward left them, before
    ``unscale_``). Each is keyed by dtype. ``flushed`` is the share of its parameters' nonzero
    float32 gradient values that are zero in float16 at the scale judged.
    """

    name: str
    kind: str
    forward: dict[str, TensorStats] = dataclasses.field(default_factory=dict)
    backward: dict[str, TensorStats] = dataclasses.field(default_factory=dict)
    params: dict[str, TensorStats] = dataclasses.field(default_factory=dict)
    flushed: float | None = None


@dataclasses.dataclass(frozen=True)
class ScalerCheck:
    """One run of real GradScaler steps that a claim of the diagnosis rests on."""

    config: AmpConfig
    steps: int
    skipped: int
    #: steps whose loss was inf/NaN
    bad_loss_steps: int
    #: whether every module's output was finite (``None``: hooks did not look)
    outputs_finite: bool | None
    #: share of float32's nonzero first-step gradient values that were zero here
    flushed: float | None
    #: the config's islands as patterns, for reading
    islands: tuple[str, ...] = ()

    @property
    def forward_finite(self) -> bool:
        return self.outputs_finite is not False and not self.bad_loss_steps

    def describe(self) -> str:
        islands = f" with {','.join(self.islands)} in float32" if self.islands else ""
        parts = [f"skipped {self.skipped} of {self.steps} steps"]
        if self.outputs_finite is not None:
            parts.append("every module's output finite" if self.outputs_finite
                         else "a module's output inf/NaN")
        if self.bad_loss_steps:
            parts.append(f"the loss inf/NaN on {self.bad_loss_steps} steps")
        elif self.outputs_finite is None:
            parts.append("the loss finite")
        if self.flushed is not None:
            parts.append(f"{_share(self.flushed)} of gradient values flushed to zero")
        return f"float16 at init_scale {self.config.init_scale:g}{islands}: {', '.join(parts)}"


@dataclasses.dataclass
class Diagnosis:
    """The per-module evidence, the runs that checked it, and the verdict of ``diagnose``.

    ``kind`` is ``forward`` (an activation overflows float16 before any scale applies; the
    fix is ``islands`` in float32, or bfloat16), ``loss`` (the loss itself overflows while
    every module's output is finite), ``gradient-overflow`` (GradScaler skips steps at
    ``init_scale``; ``suggested_init_scale`` is one it was checked not to skip at),
    ``underflow`` (too many gradient values flush to zero; ``suggested_init_scale`` keeps
    them), ``clean``, or ``float32`` (float32 itself goes non-finite: nothing for AMP to fix).
    ``checks`` are the real GradScaler runs behind the verdict.

    Example:
        >>> import scalertune
        >>> d = scalertune.diagnose("examples/attention.py:make_model")  # doctest: +SKIP
        >>> d.kind, d.culprits, d.islands  # doctest: +SKIP
        ('forward', ['attn.score'], ['attn.score'])
    """

    modules: list[ModuleReport]
    init_scale: float
    steps: int
    kind: str
    verdict: str
    culprits: list[str]
    islands: list[str]
    skipped: int
    overflowing_gradients: list[str]
    underflow_share: float | None
    suggested_init_scale: float | None
    bfloat16_finite: bool
    checks: list[ScalerCheck]
    first_forward_nonfinite: str | None
    first_backward_nonfinite: str | None
    grad_absmax: float

    def table(self) -> str:
        """Module by module, in execution order."""
        s = f"@{self.init_scale:g}"
        rows = [("module", "type", "fp16 max", "fp16 inf/nan", "bf16 max", "bf16 >65504",
                 "grad max fp32", f"grad inf/nan {s}", "param grad max fp32",
                 f"param inf/nan {s}", f"param flushed {s}")]
        for m in self.modules:
            f16, b16 = m.forward.get("float16"), m.forward.get("bfloat16")
            rows.append((
                m.name or "(model)", m.kind,
                _max(f16), _pct(f16, "nonfinite"), _max(b16), _pct(b16, "over"),
                _max(m.backward.get("float32")), _pct(m.backward.get("float16"), "nonfinite"),
                _max(m.params.get("float32")), _pct(m.params.get("float16"), "nonfinite"),
                "-" if m.flushed is None else _share(m.flushed),
            ))
        from scalertune._text import format_table

        return "\n".join(format_table(rows))

    def summary(self) -> str:
        """The table, where things first went non-finite, the checks, and the verdict."""
        lines = [self.table(), ""]
        if self.first_forward_nonfinite is not None:
            lines.append("first non-finite forward output: "
                         f"{self.first_forward_nonfinite or '(model)'}")
        if self.culprits:
            lines.append("turned finite inputs into inf/NaN: "
                         + ", ".join(c or "(model's own code)" for c in self.culprits))
        if self.first_backward_nonfinite is not None:
            lines.append(f"first non-finite gradient: {self.first_backward_nonfinite or '(model)'}")
        lines.append(f"checked with real GradScaler steps ({self.steps} per run, same seed):")
        lines += [f"  {c.describe()}" for c in self.checks]
        lines.append(f"Verdict: {self.verdict}")
        return "\n".join(lines)

    def next_command(self, factory: str) -> str | None:
        """The search to run next: with the islands, or at all when something is wrong."""
        if self.islands:
            return (f"scalertune search {factory} --fp32-modules "
                    f"{shlex.quote(','.join(self.islands))}")
        if self.kind not in ("clean", "float32"):
            return f"scalertune search {factory}"
        return None


@dataclasses.dataclass(frozen=True)
class IslandAdvice:
    """Where a forward overflow comes from, and the float32 islands that were checked to fix
    it: ``culprits`` turned finite inputs into inf/NaN (``where`` says so in one line, grouped
    into glob patterns); ``islands`` (the config's own and the culprits, grouped) is what to
    keep in float32; ``fixed`` says whether the forward was finite with them."""

    culprits: list[str]
    where: str
    islands: list[str]
    fixed: bool


def diagnose(factory_or_spec: str | Callable[[], Any], *, init_scale: float = 2.0**16,
             steps: int = _policy.DIAGNOSE_STEPS, seed: int = 0,
             device: str | torch.device = "auto",
             fp32_modules: str | Sequence[str] = ()) -> Diagnosis:
    """Watch ``steps`` training steps in float16 (at ``init_scale``, with ``fp32_modules``
    already in float32), bfloat16 and float32, check the fixes by running them, and judge.

    Raises :class:`UsageError` for an ``init_scale`` that is not a positive finite number,
    ``steps < 1``, or ``fp32_modules`` naming no module of the model, before anything runs.
    """
    if isinstance(init_scale, bool) or not isinstance(init_scale, (int, float)) or not (
            math.isfinite(init_scale) and init_scale > 0):
        raise UsageError(f"init_scale must be a positive finite number, got {init_scale!r}")
    if steps < 1:
        raise UsageError(f"steps must be >= 1, got {steps}")
    factory = (load_factory(factory_or_spec) if isinstance(factory_or_spec, str)
               else factory_or_spec)
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    config = AmpConfig(init_scale=float(init_scale), fp32_modules=fp32_modules)
    if config.fp32_modules:  # a typo is refused before any step runs
        model = build_workload(factory, seed=seed, device=dev).model
        match_modules(config.fp32_modules, (n for n, _ in model.named_modules()))
    run = _Runner(factory, steps=steps, seed=seed, device=dev)
    table: dict[str, ModuleReport] = {}
    # float32 first: every float16 run after it measures what it flushed against it.
    f32 = _attempt(run, _FLOAT32, table=table, grads=True)
    try:
        bf16: _Run | None = run(AmpConfig(dtype="bfloat16"), table=table)
    except Exception:  # bfloat16 is only the alternative; without it, none is offered
        bf16 = None
    first = _attempt(run, config, table=table, grads=True)
    culprits, current, rounds = _find_islands(run, config, first)
    checks = [first.check()] + [r.check() for r in rounds]
    judge = _Judge(run, first, current, bf16, f32, table, checks)
    islanded = match_modules(current.config.fp32_modules, first.names)
    if not f32.finite:
        kind, verdict, suggested = judge.float32_broken()
    elif current.forward_overflow:
        kind, verdict, suggested = judge.forward_unfixed(culprits)
    elif current.bad_loss_steps:
        kind, verdict, suggested = judge.loss()
    else:
        kind, verdict, suggested = judge.gradients()
        if culprits:
            kind, verdict = "forward", judge.forward_fixed(culprits, islanded, verdict)
    for name, row in table.items():
        row.flushed = _flushed(_of_module(current.first_grads, name),
                               _of_module(f32.first_grads, name))
    return Diagnosis(
        modules=list(table.values()), init_scale=config.init_scale, steps=steps, kind=kind,
        verdict=verdict, culprits=culprits,
        islands=[] if kind == "float32" or current.forward_overflow
        else group_patterns(islanded, first.names),
        skipped=first.skipped, overflowing_gradients=_overflowing_gradients(table),
        underflow_share=current.flushed, suggested_init_scale=suggested,
        bfloat16_finite=bf16 is not None and bf16.finite, checks=checks,
        first_forward_nonfinite=first.first_forward,
        first_backward_nonfinite=first.first_backward, grad_absmax=_grad_absmax(table))


def locate_forward_overflow(factory: Callable[[], Any], config: AmpConfig, losses: Sequence[float],
                            *, seed: int, device: torch.device) -> IslandAdvice | None:
    """Replay a run that overflowed forward (its per-step ``losses``) up to its first
    non-finite loss, find the modules whose own computation overflowed, and check that
    keeping them in float32 makes that forward finite. ``None`` when the overflow came too
    late to replay (``LOCATE_MAX_STEPS``) or no module is to blame."""
    first_bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    if first_bad is None or first_bad >= _policy.LOCATE_MAX_STEPS:
        return None
    run = _Runner(factory, steps=first_bad + 1, seed=seed, device=device, watch_from=first_bad)
    first = run(config)
    if not first.forward_overflow:
        return None
    culprits, current, _ = _find_islands(run, config, first)
    if not any(culprits):
        return None
    islanded = match_modules(current.config.fp32_modules, first.names)
    where = group_patterns([c for c in culprits if c], first.names)
    return IslandAdvice(culprits=culprits,
                        where=",".join(where + ["(model)"] * ("" in culprits)),
                        islands=group_patterns(islanded, first.names),
                        fixed=not current.forward_overflow)


def group_patterns(chosen: Sequence[str], names: Sequence[str]) -> list[str]:
    """``chosen`` module names as glob patterns over ``names`` that select exactly them.

    Modules that repeat (every block's ``DenseReluDense.wo``) share a pattern: the dotted
    tail they have in common (``*.DenseReluDense.wo``), or their shared name with the parts
    that differ as ``*`` (``encoder.block.*.layer.1.DenseReluDense.wo``). A pattern is used
    only if it selects no other module of the model; the one covering most names wins, then
    the one with the fewest wildcards, then the longest. What no pattern groups stays a name.
    """
    names = [n for n in names if n]
    allowed = set(chosen)
    left = [n for n in names if n in allowed]
    out: list[str] = []
    while left:
        best: tuple[tuple[int, int, int], str, set[str]] | None = None
        for pattern in _candidate_patterns(left):
            hits = {n for n in names if fnmatch.fnmatchcase(n, pattern)}
            covered = hits & set(left)
            if len(covered) < 2 or not hits <= allowed:
                continue
            key = (len(covered), -pattern.count("*"), len(pattern))
            if best is None or key > best[0]:
                best = (key, pattern, covered)
        if best is None:
            out += left
            break
        out.append(best[1])
        left = [n for n in left if n not in best[2]]
    return out


def _candidate_patterns(names: list[str]) -> Iterator[str]:
    for name in names:
        parts = name.split(".")
        for k in range(1, len(parts)):
            yield "*." + ".".join(parts[k:])
    head = names[0].split(".")
    for other in names[1:]:
        parts = other.split(".")
        if len(parts) == len(head):
            yield ".".join(a if a == b else "*" for a, b in zip(head, parts))


# -- running -------------------------------------------------------------------------------


class _Run:
    """What one run of a config did: GradScaler's skips, and what its hooks saw."""

    def __init__(self, config: AmpConfig, steps: int, names: list[str]) -> None:
        self.config, self.steps, self.names = config, steps, names
        self.skipped = 0
        self.bad_loss_steps = 0
        self.repaired = 0
        self.culprits: list[str] = []
        self.watched = False  # hooks looked at every module's output
        self.forward_overflow = False
        self.grads_nonfinite = False
        self.first_forward: str | None = None
        self.first_backward: str | None = None
        #: each parameter's gradient values on the first step (a bounded, strided sample)
        self.first_grads: dict[str, torch.Tensor] = {}
        self.first_grads_finite = True
        #: what went non-finite first, in words ("its loss", "the output of 'attn'", ...)
        self.first_bad: str | None = None
        #: share of float32's nonzero first-step gradient values that are zero here (float16
        #: runs whose first step was finite)
        self.flushed: float | None = None

    @property
    def finite(self) -> bool:
        """Nothing overflowed: no module output, no loss, no parameter gradient."""
        return not (self.forward_overflow or self.bad_loss_steps or self.grads_nonfinite)

    def check(self) -> ScalerCheck:
        islands = group_patterns(match_modules(self.config.fp32_modules, self.names), self.names)
        return ScalerCheck(self.config, self.steps, self.skipped, self.bad_loss_steps,
                           not self.forward_overflow if self.watched else None, self.flushed,
                           tuple(islands))


class _Runner:
    """Runs configs on fresh workloads of one factory, seed and device."""

    def __init__(self, factory: Callable[[], Any], *, steps: int, seed: int,
                 device: torch.device, watch_from: int = 0) -> None:
        self.factory, self.steps, self.seed, self.device = factory, steps, seed, device
        self.watch_from = watch_from
        self.float32_grads: dict[str, torch.Tensor] | None = None

    def __call__(self, config: AmpConfig, *, table: dict[str, ModuleReport] | None = None,
                 grads: bool = False, hooks: bool = True, repair: bool = False) -> _Run:
        """Train ``steps`` steps under ``config``. ``table`` collects per-module statistics
        (with the activation gradients when ``grads``); ``repair`` recomputes, in float32,
        the output of a culprit without submodules, so that one pass finds the next one."""
        workload = build_workload(self.factory, seed=self.seed, device=self.device)
        if config.clip_norm is None and workload.clip_norm is not None:
            config = dataclasses.replace(config, clip_norm=workload.clip_norm)
        model = workload.model
        record = _Run(config, self.steps, [n for n, _ in model.named_modules()])
        amp = _WatchedRuntime(config, self.device, workload, record, table)
        amp.prepare(model)
        watch: _Hooks | None = None
        batches = _cycle(workload.batches)
        model.train()
        try:
            for i in range(self.steps):
                if i == self.watch_from and hooks:
                    watch = _Hooks(model, config.dtype, record, table, grads=grads,
                                   repair=repair, device_type=self.device.type)
                batch = to_device(next(batches), self.device)
                if workload.step is not None:
                    workload.step(model, batch, amp)
                else:
                    amp.train_step(model, workload.optimizer, workload.loss_fn, batch)
        finally:
            amp.close()
            if watch is not None:
                watch.remove()
        if config.dtype == "float32":
            self.float32_grads = record.first_grads
        elif (config.dtype == "float16" and self.float32_grads is not None
              and record.first_grads_finite):
            record.flushed = _flushed(record.first_grads, self.float32_grads)
        return record


class _WatchedRuntime(AmpRuntime):
    """The real runtime, reading what GradScaler decides at each step.

    Before ``unscale_`` it reads the parameter gradients the scaled backward produced; an
    optimizer step hook counts the steps that really happened, so a step GradScaler skipped is
    one the optimizer never took: a count of what PyTorch did, not an inference from the
    scale.
    """

    def __init__(self, config: AmpConfig, device: torch.device, workload: Workload,
                 record: _Run, table: dict[str, ModuleReport] | None) -> None:
        super().__init__(config, device=device)
        self._record, self._table = record, table
        self._modules = list(workload.model.named_modules())
        self._taken = 0
        self._bad_loss = False
        self._hook = workload.optimizer.register_step_post_hook(self._count)

    def _count(self, *_: Any) -> None:
        self._taken += 1

    def backward(self, loss: torch.Tensor) -> None:
        if not bool(torch.isfinite(loss.detach()).all()):
            self._bad_loss = True
            self._record.first_bad = self._record.first_bad or "its loss"
        super().backward(loss)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self._read_gradients()
        taken = self._taken
        super().step(optimizer)
        self._record.skipped += self._taken == taken
        self._record.bad_loss_steps += self._bad_loss
        self._bad_loss = False

    def _read_gradients(self) -> None:
        first = self.steps == 0
        seen: set[int] = set()
        for name, module in self._modules:
            for pname, p in module.named_parameters(recurse=False):
                if p.grad is None or id(p) in seen:
                    continue
                seen.add(id(p))
                if not bool(torch.isfinite(p.grad).all()):
                    self._record.grads_nonfinite = True
                    self._record.first_bad = self._record.first_bad or "its parameter gradients"
                    self._record.first_grads_finite &= not first
                if self._table is not None:
                    _row(self._table, name, module).params.setdefault(
                        self.config.dtype, TensorStats()).add(p.grad)
                if first:
                    self._record.first_grads[f"{name}.{pname}"] = _sample(p.grad)

    def close(self) -> None:
        self._hook.remove()


class _Hooks:
    """Forward hooks on every module (and gradient hooks on their outputs) for one run."""

    def __init__(self, model: torch.nn.Module, dtype: str, record: _Run,
                 table: dict[str, ModuleReport] | None, *, grads: bool, repair: bool,
                 device_type: str) -> None:
        self.dtype, self.record, self.table = dtype, record, table
        self.grads, self.repair, self.device_type = grads, repair, device_type
        record.watched = True
        self._below: list[bool] = []  # per running module: did a submodule overflow?
        self._handles = []
        for name, module in model.named_modules():
            self._handles.append(module.register_forward_pre_hook(self._enter))
            self._handles.append(module.register_forward_hook(
                self._leave(name), with_kwargs=True, always_call=True))

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
                        f"the output of {name or '(model)'}")
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


def _attempt(run: _Runner, config: AmpConfig, **kwargs: Any) -> _Run:
    try:
        return run(config, **kwargs)
    except UsageError:
        raise
    except Exception as exc:  # the user's model or step, under this dtype
        raise TrainingFailed(
            f"{config.dtype} training of the workload raised {one_line(exc)}: there is "
            f"nothing to diagnose in {config.dtype} on this device") from exc


def _find_islands(run: _Runner, config: AmpConfig,
                  first: _Run) -> tuple[list[str], _Run, list[_Run]]:
    """Keep the culprits found so far in float32 and rerun, until the forward is finite.

    Each rerun also recomputes any further culprit without submodules in float32 on the spot
    (so the modules after it see what they would see with it islanded) and names it; a rerun
    that had nothing to recompute is a plain run, and it is the check. Returns the culprits,
    the last plain run (``first`` if none was needed) and the plain reruns.
    """
    culprits = list(first.culprits)
    current, plain = first, []
    if not first.forward_overflow:
        return [], first, []
    for _ in range(_policy.DIAGNOSE_ISLAND_ROUNDS):
        islands = tuple(c for c in culprits if c)
        if not islands:
            break
        trial = run(dataclasses.replace(config, fp32_modules=config.fp32_modules + islands),
                    repair=True)
        new = [c for c in trial.culprits if c not in culprits]
        culprits += new
        if trial.repaired == 0:
            current = trial
            plain.append(trial)
            if not new:
                break
    islands = tuple(c for c in culprits if c)
    if islands and current.config.fp32_modules != config.fp32_modules + islands:
        current = run(dataclasses.replace(config, fp32_modules=config.fp32_modules + islands))
        plain.append(current)
    return culprits, current, plain


class _Judge:
    """The verdict, from the runs made so far, and the scales it checks by running them."""

    def __init__(self, run: _Runner, first: _Run, current: _Run, bf16: _Run | None, f32: _Run,
                 table: dict[str, ModuleReport], checks: list[ScalerCheck]) -> None:
        self.run, self.first, self.current = run, first, current
        self.bf16, self.f32, self.table, self.checks = bf16, f32, table, checks
        self.flushed = current.flushed

    @property
    def scale(self) -> float:
        return self.current.config.init_scale

    def bfloat16_line(self) -> str:
        if self.bf16 is not None and self.bf16.finite:
            return " bfloat16 stays finite in every module, with no scaler: the alternative."
        return ""

    def float32_broken(self) -> tuple[str, str, None]:
        f32 = self.f32
        return ("float32",
                f"float32 itself goes non-finite ({f32.first_bad} inf/NaN within {f32.steps} "
                "steps), so no mixed-precision setting can do better: fix the workload "
                "(learning rate, loss, data, initialisation) before tuning AMP.", None)

    def forward_unfixed(self, culprits: list[str]) -> tuple[str, str, None]:
        modules = [c for c in culprits if c]
        head = f"forward overflow at init_scale {self.first.config.init_scale:g}"
        if modules:
            them = "them" if len(modules) > 1 else "it"
            text = (f"{head} in {self._where(modules)}, before any loss scale applies; keeping "
                    f"{them} in float32 is not enough: checked, the forward is still inf/NaN "
                    f"(from {self.current.first_forward or '(model)'})")
        elif "" in culprits:
            text = (f"{head} in the model's own forward code (outside any submodule), before "
                    "any loss scale applies, so no scaler setting fixes it: move that "
                    "computation into a submodule to keep it in float32")
        else:
            text = f"{head}: the model's inputs already hold inf/NaN"
        return "forward", text + "." + (self.bfloat16_line() or " Train in float32."), None

    def _where(self, culprits: list[str]) -> str:
        if len(culprits) == 1:
            return f"module {culprits[0]!r}"
        return f"{len(culprits)} modules ({', '.join(group_patterns(culprits, self.first.names))})"

    def loss(self) -> tuple[str, str, None]:
        cur = self.current
        return ("loss",
                f"the loss itself is inf/NaN in float16 on {cur.bad_loss_steps} of {cur.steps} "
                "steps while every module's output is finite: the loss function overflows "
                "float16, before any loss scale applies. Compute it in float32 (outside "
                f"autocast, or on .float() outputs).{self.bfloat16_line()}", None)

    def forward_fixed(self, culprits: list[str], islanded: list[str], gradients: str) -> str:
        patterns = group_patterns(islanded, self.first.names)
        return (f"forward overflow in {self._where(culprits)}: float16 turns finite inputs into "
                "inf/NaN there, before any loss scale applies, so no scaler setting fixes it. Keep "
                f"{'them' if len(culprits) > 1 else 'it'} in float32 (--fp32-modules "
                f"{shlex.quote(','.join(patterns))}): checked, the forward is then finite."
                f"{self.bfloat16_line()} With the islands, {gradients}")

    def gradients(self) -> tuple[str, str, float | None]:
        """Overflow, underflow or clean at the scale asked for, on the config that runs
        forward finite (with its islands)."""
        cur, scale = self.current, self.scale
        seen = f"GradScaler at init_scale {scale:g} skipped {cur.skipped} of {cur.steps} steps"
        if cur.skipped:
            return self._overflow(seen)
        if self.flushed is not None and self.flushed > _policy.UNDERFLOW_SHARE:
            return self._underflow(seen)
        flushed = "" if self.flushed is None else (
            f" and {_share(self.flushed)} of the gradient values flush to zero (under "
            f"{_policy.UNDERFLOW_SHARE:.0%})")
        return "clean", f"clean at init_scale {scale:g}: {seen}{flushed}.", None

    def _overflow(self, seen: str) -> tuple[str, str, float | None]:
        where = _overflowing_gradients(self.table)
        named = f" (the gradients of {_list(where[:4])} overflow float16 once scaled)" \
            if where else ""
        absmax = _grad_absmax(self.table)
        bad = math.ceil(math.log2(self.scale))  # skips here, as it did at the smaller scale
        guess = math.floor(math.log2(_policy.FLOAT16_MAX / absmax)) if absmax > 0 else bad - 1
        found = self._search(lambda r: r.skipped == 0, bad=bad,
                             toward=_exponent(_policy.SCALE_FLOOR), guess=guess)
        head = f"gradient overflow at init_scale {self.scale:g}: {seen}{named}."
        if found is None:
            return ("gradient-overflow",
                    f"{head} No init_scale down to the floor of 2**-24 avoids it: the "
                    f"gradients overflow float16 at any scale.{self.bfloat16_line()}", None)
        scale, probe = found
        text = (f"{head} A smaller scale fixes it: at init_scale {scale:g} GradScaler skipped "
                f"none of the {probe.steps} steps (checked).")
        if probe.flushed is not None and probe.flushed > _policy.UNDERFLOW_SHARE:
            text += (f" But there {_share(probe.flushed)} of the gradient values flush to "
                     "zero: no float16 scale both fits and keeps them.")
            text += self.bfloat16_line() or ""
        elif scale < 1:
            text += (" A scale below 1 means the gradients overflow float16 even at their true "
                     "size." + (self.bfloat16_line() or ""))
        return "gradient-overflow", text, scale

    def _underflow(self, seen: str) -> tuple[str, str, float | None]:
        head = (f"underflow at init_scale {self.scale:g}: {seen}, but {_share(self.flushed)} "
                "of the gradient values that are nonzero in float32 are zero in float16 (the "
                "loss stays flat: no skipped step, no NaN).")
        values = torch.cat(list(self.f32.first_grads.values())) if self.f32.first_grads \
            else torch.zeros(0)
        nonzero = values[values > 0]
        guess = _exponent(self.scale) + 1
        if nonzero.numel():
            nonzero = nonzero[:: max(1, nonzero.numel() // 1_000_000)]  # quantile's size limit
            low = float(torch.quantile(nonzero, _policy.UNDERFLOW_SHARE))
            guess = math.ceil(math.log2(_policy.FLOAT16_SMALLEST_SUBNORMAL / 2 / low))
        found = self._search(
            lambda r: r.flushed is not None and r.flushed <= _policy.UNDERFLOW_SHARE,
            bad=_exponent(self.scale), toward=_exponent(_policy.DIAGNOSE_MAX_SCALE), guess=guess)
        if found is None:
            return ("underflow", f"{head} No init_scale up to 2**24 keeps them."
                    f"{self.bfloat16_line()}", None)
        scale, probe = found
        if probe.skipped:
            return ("underflow",
                    f"{head} At init_scale {scale:g}, which keeps them, GradScaler skips "
                    f"{probe.skipped} of {probe.steps} steps (checked): no float16 scale both "
                    f"fits and keeps them.{self.bfloat16_line()}", None)
        return ("underflow",
                f"{head} A larger scale fixes it: at init_scale {scale:g} "
                f"{_share(probe.flushed)} flush and GradScaler skipped none of the "
                f"{probe.steps} steps (checked).", scale)

    def _search(self, ok: Callable[[_Run], bool], *, bad: int, toward: int,
                guess: int) -> tuple[float, _Run] | None:
        """The power of two nearest ``2**bad`` (where ``ok`` fails), looking toward
        ``2**toward``, at which a real run is ``ok``: a bisection that assumes ``ok`` holds
        from some exponent on, starting from ``guess``."""
        step = 1 if toward > bad else -1
        good: tuple[int, _Run] | None = None
        e = min(max(guess, bad + step), toward) if step > 0 else max(min(guess, bad + step),
                                                                     toward)
        for _ in range(_policy.DIAGNOSE_MAX_PROBES):
            probe = self.run(dataclasses.replace(self.current.config, init_scale=2.0**e),
                             hooks=False)
            self.checks.append(probe.check())
            if ok(probe):
                good = (e, probe)
            else:
                bad = e
            far = good[0] if good is not None else toward + step
            if abs(far - bad) <= 1:
                break
            e = bad + step * (abs(far - bad) // 2)
        return None if good is None else (2.0**good[0], good[1])


# -- helpers -------------------------------------------------------------------------------


def _row(table: dict[str, ModuleReport], name: str, module: torch.nn.Module) -> ModuleReport:
    if name not in table:
        table[name] = ModuleReport(name, type(module).__name__)
    return table[name]


def _overflowed(t: torch.Tensor) -> bool:
    """NaN or +inf, or -inf in a tensor that carries a gradient (without one: a mask)."""
    if bool(torch.isfinite(t).all()):
        return False
    return t.requires_grad or bool(torch.isnan(t).any()) or bool((t == math.inf).any())


def _overflowing_gradients(table: dict[str, ModuleReport]) -> list[str]:
    """Modules whose parameter gradients (or, failing those, output gradients) were inf/NaN
    in the float16 run."""
    params = [m.name for m in table.values()
              if m.params.get("float16") and m.params["float16"].nonfinite]
    if params:
        return params
    return [m.name for m in table.values()
            if m.backward.get("float16") and m.backward["float16"].nonfinite]


def _grad_absmax(table: dict[str, ModuleReport]) -> float:
    """The largest true (float32) gradient of any module output or parameter."""
    return max((s.absmax for m in table.values() for s in (m.backward.get("float32"),
                                                           m.params.get("float32")) if s),
               default=0.0)


def _sample(t: torch.Tensor, limit: int = 100_000) -> torch.Tensor:
    """Up to ``limit`` values of ``t``, evenly strided: enough for a share, and bounded. The
    same stride for the same shape, so float16's and float32's samples pair up."""
    flat = t.detach().float().abs().flatten()
    return flat[:: max(1, flat.numel() // limit)].cpu()


def _flushed(float16: dict[str, torch.Tensor], float32: dict[str, torch.Tensor]) -> float | None:
    """Share of the gradient values nonzero in float32 that are exactly zero in float16."""
    lost = kept = 0
    for key, g32 in float32.items():
        g16 = float16.get(key)
        if g16 is None or g16.shape != g32.shape:
            continue
        nonzero = g32 != 0
        kept += int(nonzero.sum())
        lost += int((nonzero & (g16 == 0)).sum())
    return lost / kept if kept else None


def _of_module(grads: dict[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    prefix = f"{name}."
    return {k: v for k, v in grads.items()
            if k.startswith(prefix) and "." not in k[len(prefix):]}


def _exponent(scale: float) -> int:
    return math.floor(math.log2(scale))


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


def _cycle(batches: Any) -> Iterator[Any]:
    while True:
        yield from batches


def _list(names: Sequence[str]) -> str:
    shown = [repr(n) if n else "the model's own code" for n in names]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def _share(v: float) -> str:
    return "0%" if v == 0 else f"{v:.1%}"


def _max(stats: TensorStats | None) -> str:
    if stats is None:
        return "-"
    if stats.total and stats.nonfinite == stats.total:
        return "inf/nan"
    return f"{stats.absmax:.3g}"


def _pct(stats: TensorStats | None, field: str) -> str:
    return "-" if stats is None else ("0" if not getattr(stats, field)
                                      else f"{stats.share(getattr(stats, field)):.1%}")
