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

Hooks live only inside :func:`diagnose` and
:func:`~scalertune._diagnose._locate.locate_forward_overflow`; a search installs none unless
it locates the overflow of a trial it pruned for one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from scalertune import _policy
from scalertune._amp._config import AmpConfig, parse_islands
from scalertune._amp._device import resolve_device
from scalertune._amp._modules import match_modules
from scalertune._diagnose._conclusions import _Judge, float32_broken
from scalertune._diagnose._gradients import _grad_absmax, _overflowing_gradients
from scalertune._diagnose._locate import _find_islands, group_patterns
from scalertune._diagnose._report import Diagnosis, ModuleReport
from scalertune._diagnose._runner import (
    _FLOAT32,
    _attempt,
    _flushed,
    _of_module,
    _Run,
    _Runner,
)
from scalertune._errors import UsageError
from scalertune._workload._factory import build_workload
from scalertune._workload._loader import load_factory


def diagnose(
    factory_or_spec: str | Callable[[], Any],
    *,
    init_scale: float = 2.0**16,
    steps: int = _policy.DIAGNOSE_STEPS,
    seed: int = 0,
    device: str | torch.device = "auto",
    fp32_modules: str | Sequence[str] = (),
) -> Diagnosis:
    """Find where float16 overflows or underflows, module by module, and check the fixes.

    Trains ``steps`` steps in float16 (at ``init_scale``, with ``fp32_modules`` already in
    float32), bfloat16 and float32, with every module's forward output and gradient
    watched; then runs the fixes it suggests (float32 islands, another ``init_scale``) with
    the real GradScaler to check them, and judges.

    Args:
        factory_or_spec: ``path/to/model.py:make_model``, ``package.module:make_model`` or the
            factory itself, as for :func:`search`.
        init_scale: The loss scale float16 is diagnosed at (PyTorch's ``2**16`` by default).
        steps: How many training steps each run watches.
        seed: The seed of every run.
        device: ``"auto"`` (CUDA when this machine has it), ``"cuda"``, ``"cpu"`` or a
            ``torch.device``.
        fp32_modules: Modules already kept in float32 (names or glob patterns; a
            comma-separated string is split): the diagnosis looks for what overflows besides.

    Returns:
        The :class:`Diagnosis`: the table, the culprits, the islands that fix a forward
        overflow, a checked ``init_scale`` and the verdict.

    Raises:
        UsageError: ``init_scale`` is not a positive finite number, ``steps`` is below 1,
            ``fp32_modules`` names no module of the model, or the factory breaks its
            contract; before anything trains (the command line exits with status 2).

    Example:
        >>> import scalertune
        >>> d = scalertune.diagnose("examples/attention.py:make_model")  # doctest: +SKIP
        >>> d.kind, d.islands  # doctest: +SKIP
        ('forward', ['attn.score'])
        >>> print(d.next_command("examples/attention.py:make_model"))  # doctest: +SKIP
        scalertune search examples/attention.py:make_model --fp32-modules attn.score
    """
    _check(init_scale, steps)
    factory = load_factory(factory_or_spec) if isinstance(factory_or_spec, str) else factory_or_spec
    dev = resolve_device(device)
    config = AmpConfig(init_scale=float(init_scale), fp32_modules=parse_islands(fp32_modules))
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
        kind, verdict, suggested = float32_broken(f32)
    elif current.forward_overflow:
        kind, verdict, suggested = judge.forward_unfixed(culprits)
    elif current.bad_loss_steps:
        kind, verdict, suggested = judge.loss()
    else:
        kind, verdict, suggested = judge.gradients()
        if culprits:
            kind, verdict = "forward", judge.forward_fixed(culprits, islanded, verdict)
    for name, row in table.items():
        row.flushed = _flushed(
            _of_module(current.first_grads, name), _of_module(f32.first_grads, name)
        )
    return _diagnosis(
        table,
        config,
        steps,
        kind,
        verdict,
        suggested,
        culprits,
        islanded,
        first,
        current,
        bf16,
        checks,
    )


def _check(init_scale: Any, steps: int) -> None:
    """:class:`UsageError` for an ``init_scale`` or ``steps`` no run can take."""
    if (
        isinstance(init_scale, bool)
        or not isinstance(init_scale, (int, float))
        or not (math.isfinite(init_scale) and init_scale > 0)
    ):
        raise UsageError(f"init_scale must be a positive finite number, got {init_scale!r}")
    if steps < 1:
        raise UsageError(f"steps must be >= 1, got {steps}")


def _diagnosis(
    table: dict[str, ModuleReport],
    config: AmpConfig,
    steps: int,
    kind: str,
    verdict: str,
    suggested: float | None,
    culprits: list[str],
    islanded: list[str],
    first: _Run,
    current: _Run,
    bf16: _Run | None,
    checks: list[Any],
) -> Diagnosis:
    """The judged runs as the :class:`Diagnosis` users read."""
    return Diagnosis(
        modules=list(table.values()),
        init_scale=config.init_scale,
        steps=steps,
        kind=kind,
        verdict=verdict,
        culprits=culprits,
        islands=[]
        if kind == "float32" or current.forward_overflow
        else group_patterns(islanded, first.names),
        skipped=first.skipped,
        overflowing_gradients=_overflowing_gradients(table),
        underflow_share=current.flushed,
        suggested_init_scale=suggested,
        bfloat16_finite=bf16 is not None and bf16.finite,
        checks=checks,
        first_forward_nonfinite=first.first_forward,
        first_backward_nonfinite=first.first_backward,
        grad_absmax=_grad_absmax(table),
    )


# -- running -------------------------------------------------------------------------------


# -- helpers -------------------------------------------------------------------------------
