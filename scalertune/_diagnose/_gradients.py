"""The gradients' verdict at the scale asked for (overflow, underflow or clean), and the scale
that fixes an overflow or an underflow, each checked by a real GradScaler run (a bisection
over scales)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._diagnose import _policy as _diagnose_policy
from scalertune._diagnose._report import ModuleReport, ScalerCheck, _list, _share
from scalertune._diagnose._runner import _Run, _Runner


class _GradientJudge:
    """The gradients' verdict, on the config that runs forward finite (with its islands), and
    the scales it checks by running them; ``alternative`` is the line that offers bfloat16,
    or nothing."""

    def __init__(
        self,
        run: _Runner,
        current: _Run,
        f32: _Run,
        table: dict[str, ModuleReport],
        checks: list[ScalerCheck],
        alternative: str,
    ) -> None:
        self.run, self.current, self.f32 = run, current, f32
        self.table, self.checks, self.alternative = table, checks, alternative
        self.flushed = current.flushed

    @property
    def scale(self) -> float:
        return self.current.config.init_scale

    def verdict(self) -> tuple[str, str, float | None]:
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
        bad = math.ceil(math.log2(self.scale))  # skips here, as it did at the smaller scale
        found = bisect_scale(
            self.run,
            self.current.config,
            self.checks,
            lambda r: r.skipped == 0,
            bad=bad,
            toward=_exponent(_policy.SCALE_FLOOR),
            guess=_overflow_guess(self.table, bad),
        )
        head = f"gradient overflow at init_scale {self.scale:g}: {seen}{named}."
        if found is None:
            return (
                "gradient-overflow",
                f"{head} No init_scale down to the floor of 2**-24 avoids it: the "
                f"gradients overflow float16 at any scale.{self.alternative}",
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
            text += self.alternative
        elif scale < 1:
            text += (
                " A scale below 1 means the gradients overflow float16 even at their true "
                "size." + self.alternative
            )
        return "gradient-overflow", text, scale

    def _underflow(self, seen: str) -> tuple[str, str, float | None]:
        head = (
            f"underflow at init_scale {self.scale:g}: {seen}, but {_share(self.flushed)} "
            "of the gradient values that are nonzero in float32 are zero in float16 (the "
            "loss stays flat: no skipped step, no NaN)."
        )
        found = bisect_scale(
            self.run,
            self.current.config,
            self.checks,
            lambda r: r.flushed is not None and r.flushed <= _policy.UNDERFLOW_SHARE,
            bad=_exponent(self.scale),
            toward=_exponent(_diagnose_policy.DIAGNOSE_MAX_SCALE),
            guess=_underflow_guess(self.f32, self.scale),
        )
        if found is None:
            return (
                "underflow",
                f"{head} No init_scale up to 2**24 keeps them.{self.alternative}",
                None,
            )
        scale, probe = found
        if probe.skipped:
            return (
                "underflow",
                f"{head} At init_scale {scale:g}, which keeps them, GradScaler skips "
                f"{probe.skipped} of {probe.steps} steps (checked): no float16 scale both "
                f"fits and keeps them.{self.alternative}",
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


def _overflow_guess(table: dict[str, ModuleReport], bad: int) -> int:
    """Where a bisection for a scale that overflows no gradient starts: the largest true
    gradient just fits float16 there (one below ``bad`` where none is known)."""
    absmax = _grad_absmax(table)
    return math.floor(math.log2(_policy.FLOAT16_MAX / absmax)) if absmax > 0 else bad - 1


def _underflow_guess(f32: _Run, scale: float) -> int:
    """Where a bisection for a scale that keeps the gradients starts: scaled there, the
    ``UNDERFLOW_SHARE`` quantile of the nonzero float32 gradients no longer rounds to zero in
    float16 (one above ``scale`` where none is nonzero)."""
    values = torch.cat(list(f32.first_grads.values())) if f32.first_grads else torch.zeros(0)
    nonzero = values[values > 0]
    if not nonzero.numel():
        return _exponent(scale) + 1
    nonzero = nonzero[:: max(1, nonzero.numel() // 1_000_000)]  # quantile's size limit
    low = float(torch.quantile(nonzero, _policy.UNDERFLOW_SHARE))
    return math.ceil(math.log2(_policy.FLOAT16_SMALLEST_SUBNORMAL / 2 / low))


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
