"""The conclusions of a diagnosis (its verdict and its fix), each claim checked by a real
GradScaler run (a bisection over scales)."""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Callable

import torch

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._diagnose import _policy as _diagnose_policy
from scalertune._diagnose._patterns import group_patterns
from scalertune._diagnose._report import ModuleReport, ScalerCheck, _list, _share
from scalertune._diagnose._runner import _Run, _Runner


def float32_broken(f32: _Run) -> tuple[str, str, None]:
    """The verdict where float32 itself goes non-finite: nothing to tune."""
    return (
        "float32",
        f"float32 itself goes non-finite ({f32.first_bad} inf/NaN within {f32.steps} "
        "steps), so no mixed-precision setting can do better: fix the workload "
        "(learning rate, loss, data, initialisation) before tuning AMP.",
        None,
    )


def _where(culprits: list[str], names: list[str]) -> str:
    """The modules named in a verdict: one by name, several as the patterns that cover them."""
    if len(culprits) == 1:
        return f"module {culprits[0]!r}"
    return f"{len(culprits)} modules ({', '.join(group_patterns(culprits, names))})"


class _Judge:
    """The verdict, from the runs made so far, and the scales it checks by running them."""

    def __init__(
        self,
        run: _Runner,
        first: _Run,
        current: _Run,
        bf16: _Run | None,
        f32: _Run,
        table: dict[str, ModuleReport],
        checks: list[ScalerCheck],
    ) -> None:
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

    def forward_unfixed(self, culprits: list[str]) -> tuple[str, str, None]:
        modules = [c for c in culprits if c]
        head = f"forward overflow at init_scale {self.first.config.init_scale:g}"
        if modules:
            them = "them" if len(modules) > 1 else "it"
            where = _where(modules, self.first.names)
            text = (
                f"{head} in {where}, before any loss scale applies; keeping "
                f"{them} in float32 is not enough: checked, the forward is still inf/NaN "
                f"(from {self.current.first_forward or '(model)'})"
            )
        elif "" in culprits:
            text = (
                f"{head} in the model's own forward code (outside any submodule), before "
                "any loss scale applies, so no scaler setting fixes it: move that "
                "computation into a submodule to keep it in float32"
            )
        else:
            text = f"{head}: the model's inputs already hold inf/NaN"
        return "forward", text + "." + (self.bfloat16_line() or " Train in float32."), None

    def loss(self) -> tuple[str, str, None]:
        cur = self.current
        return (
            "loss",
            f"the loss itself is inf/NaN in float16 on {cur.bad_loss_steps} of {cur.steps} "
            "steps while every module's output is finite: the loss function overflows "
            "float16, before any loss scale applies. Compute it in float32 (outside "
            f"autocast, or on .float() outputs).{self.bfloat16_line()}",
            None,
        )

    def forward_fixed(self, culprits: list[str], islanded: list[str], gradients: str) -> str:
        patterns = group_patterns(islanded, self.first.names)
        where = _where(culprits, self.first.names)
        return (
            f"forward overflow in {where}: float16 turns finite inputs into "
            "inf/NaN there, before any loss scale applies, so no scaler setting fixes it. Keep "
            f"{'them' if len(culprits) > 1 else 'it'} in float32 (--fp32-modules "
            f"{shlex.quote(','.join(patterns))}): checked, the forward is then finite."
            f"{self.bfloat16_line()} With the islands, {gradients}"
        )

    def gradients(self) -> tuple[str, str, float | None]:
        """Overflow, underflow or clean at the scale asked for, on the config that runs
        forward finite (with its islands)."""
        cur, scale = self.current, self.scale
        seen = f"GradScaler at init_scale {scale:g} skipped {cur.skipped} of {cur.steps} steps"
        if cur.skipped:
            return self._overflow(seen)
        if self.flushed is not None and self.flushed > _policy.UNDERFLOW_SHARE:
            return self._underflow(seen)
        flushed = (
            ""
            if self.flushed is None
            else (
                f" and {_share(self.flushed)} of the gradient values flush to zero (under "
                f"{_policy.UNDERFLOW_SHARE:.0%})"
            )
        )
        return "clean", f"clean at init_scale {scale:g}: {seen}{flushed}.", None

    def _overflow(self, seen: str) -> tuple[str, str, float | None]:
        where = _overflowing_gradients(self.table)
        named = (
            f" (the gradients of {_list(where[:4])} overflow float16 once scaled)" if where else ""
        )
        absmax = _grad_absmax(self.table)
        bad = math.ceil(math.log2(self.scale))  # skips here, as it did at the smaller scale
        guess = math.floor(math.log2(_policy.FLOAT16_MAX / absmax)) if absmax > 0 else bad - 1
        found = bisect_scale(
            self.run,
            self.current.config,
            self.checks,
            lambda r: r.skipped == 0,
            bad=bad,
            toward=_exponent(_policy.SCALE_FLOOR),
            guess=guess,
        )
        head = f"gradient overflow at init_scale {self.scale:g}: {seen}{named}."
        if found is None:
            return (
                "gradient-overflow",
                f"{head} No init_scale down to the floor of 2**-24 avoids it: the "
                f"gradients overflow float16 at any scale.{self.bfloat16_line()}",
                None,
            )
        scale, probe = found
        text = (
            f"{head} A smaller scale fixes it: at init_scale {scale:g} GradScaler skipped "
            f"none of the {probe.steps} steps (checked)."
        )
        if probe.flushed is not None and probe.flushed > _policy.UNDERFLOW_SHARE:
            text += (
                f" But there {_share(probe.flushed)} of the gradient values flush to "
                "zero: no float16 scale both fits and keeps them."
            )
            text += self.bfloat16_line() or ""
        elif scale < 1:
            text += (
                " A scale below 1 means the gradients overflow float16 even at their true "
                "size." + (self.bfloat16_line() or "")
            )
        return "gradient-overflow", text, scale

    def _underflow(self, seen: str) -> tuple[str, str, float | None]:
        head = (
            f"underflow at init_scale {self.scale:g}: {seen}, but {_share(self.flushed)} "
            "of the gradient values that are nonzero in float32 are zero in float16 (the "
            "loss stays flat: no skipped step, no NaN)."
        )
        values = (
            torch.cat(list(self.f32.first_grads.values()))
            if self.f32.first_grads
            else torch.zeros(0)
        )
        nonzero = values[values > 0]
        guess = _exponent(self.scale) + 1
        if nonzero.numel():
            nonzero = nonzero[:: max(1, nonzero.numel() // 1_000_000)]  # quantile's size limit
            low = float(torch.quantile(nonzero, _policy.UNDERFLOW_SHARE))
            guess = math.ceil(math.log2(_policy.FLOAT16_SMALLEST_SUBNORMAL / 2 / low))
        found = bisect_scale(
            self.run,
            self.current.config,
            self.checks,
            lambda r: r.flushed is not None and r.flushed <= _policy.UNDERFLOW_SHARE,
            bad=_exponent(self.scale),
            toward=_exponent(_diagnose_policy.DIAGNOSE_MAX_SCALE),
            guess=guess,
        )
        if found is None:
            return (
                "underflow",
                f"{head} No init_scale up to 2**24 keeps them.{self.bfloat16_line()}",
                None,
            )
        scale, probe = found
        if probe.skipped:
            return (
                "underflow",
                f"{head} At init_scale {scale:g}, which keeps them, GradScaler skips "
                f"{probe.skipped} of {probe.steps} steps (checked): no float16 scale both "
                f"fits and keeps them.{self.bfloat16_line()}",
                None,
            )
        return (
            "underflow",
            f"{head} A larger scale fixes it: at init_scale {scale:g} "
            f"{_share(probe.flushed)} flush and GradScaler skipped none of the "
            f"{probe.steps} steps (checked).",
            scale,
        )


def _overflowing_gradients(table: dict[str, ModuleReport]) -> list[str]:
    """Modules whose parameter gradients (or, failing those, output gradients) were inf/NaN
    in the float16 run."""
    params = [
        m.name for m in table.values() if m.params.get("float16") and m.params["float16"].nonfinite
    ]
    if params:
        return params
    return [
        m.name
        for m in table.values()
        if m.backward.get("float16") and m.backward["float16"].nonfinite
    ]


def _grad_absmax(table: dict[str, ModuleReport]) -> float:
    """The largest true (float32) gradient of any module output or parameter."""
    return max(
        (
            s.absmax
            for m in table.values()
            for s in (m.backward.get("float32"), m.params.get("float32"))
            if s
        ),
        default=0.0,
    )


def _exponent(scale: float) -> int:
    return math.floor(math.log2(scale))


def bisect_scale(
    run: _Runner,
    config: AmpConfig,
    checks: list[ScalerCheck],
    ok: Callable[[_Run], bool],
    *,
    bad: int,
    toward: int,
    guess: int,
) -> tuple[float, _Run] | None:
    """The power of two nearest ``2**bad`` (where ``ok`` fails), looking toward
    ``2**toward``, at which a real run is ``ok``: a bisection that assumes ``ok`` holds
    from some exponent on, starting from ``guess``."""
    step = 1 if toward > bad else -1
    good: tuple[int, _Run] | None = None
    e = min(max(guess, bad + step), toward) if step > 0 else max(min(guess, bad + step), toward)
    for _ in range(_diagnose_policy.DIAGNOSE_MAX_PROBES):
        probe = run(dataclasses.replace(config, init_scale=2.0**e), hooks=False)
        checks.append(probe.check())
        if ok(probe):
            good = (e, probe)
        else:
            bad = e
        far = good[0] if good is not None else toward + step
        if abs(far - bad) <= 1:
            break
        e = bad + step * (abs(far - bad) // 2)
    return None if good is None else (2.0 ** good[0], good[1])
