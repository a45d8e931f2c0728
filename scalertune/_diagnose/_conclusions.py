"""The conclusions of a diagnosis (its verdict and its fix), each claim checked by a real
GradScaler run (a bisection over scales): the forward's and the loss's here, the gradients'
in :mod:`scalertune._diagnose._gradients`."""

from __future__ import annotations

import shlex

from scalertune._diagnose._gradients import _GradientJudge
from scalertune._diagnose._patterns import group_patterns
from scalertune._diagnose._report import ModuleReport, ScalerCheck
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
    """The verdict, from the runs made so far: the forward's and the loss's; the gradients',
    and the scales checked by running them, by its :class:`_GradientJudge`."""

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
        #: The gradients' verdict, and the scale that fixes them.
        self.gradient_judge = _GradientJudge(run, current, f32, table, checks, self.bfloat16_line())

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
        forward finite (with its islands): :meth:`_GradientJudge.verdict`."""
        return self.gradient_judge.verdict()
