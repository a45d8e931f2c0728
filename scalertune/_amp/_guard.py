"""The production guard: stop training when the loss scale collapses."""

from __future__ import annotations

import dataclasses

from scalertune import _policy
from scalertune._errors import UsageError
from scalertune._limits import FLOAT32_MAX
from scalertune._text import shown


class AmpGuardError(RuntimeError):
    """Training went non-finite in a way no loss scale recovers from; the message says why."""


@dataclasses.dataclass(frozen=True)
class Guard:
    """Stop training when the loss scale collapses, instead of training on silently.

    What DeepSpeed's ``raise_error_at_min_scale`` and fairseq's minimum-scale error do: every
    ``check_every`` steps the runtime checks that the scale is at least ``min_scale`` and that
    fewer than ``max_consecutive_skips`` steps in a row were skipped, and raises
    :class:`AmpGuardError` otherwise. The check costs one host read, of the scale: the runtime
    knows which steps were skipped on the host already (GradScaler decided there), except for
    a fused optimizer, whose per-step flags come back in the same read. A
    :class:`~scalertune._amp._watch.Watch` is checked at the same cadence, from the same read.
    The YAML a search writes carries limits taken from the search's evidence.

    Args:
        min_scale: The lowest loss scale a healthy run reaches; below it the gradients are
            inf/NaN at every scale.
        max_consecutive_skips: Skipped steps in a row that stop the run.
        check_every: Steps between the guard's reads of the scale.

    Raises:
        UsageError: ``min_scale`` is not a finite number above 0, or a count is below 1.

    Example:
        >>> import torch, scalertune
        >>> guard = scalertune.Guard(min_scale=1.0, max_consecutive_skips=3, check_every=1)
        >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=4.0), device="cpu",
        ...                             guard=guard)
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> for _ in range(3):
        ...     amp.backward(model(torch.full((1, 2), float("inf"))).sum())
        ...     _ = amp.step(optimizer)
        Traceback (most recent call last):
        ...
        scalertune._amp._guard.AmpGuardError: AMP guard at step 3: the loss scale is 0.5 ...
    """

    min_scale: float = _policy.SCALE_FLOOR
    max_consecutive_skips: int = _policy.MAX_CONSECUTIVE_SKIPS
    check_every: int = _policy.READBACK_INTERVAL

    def __post_init__(self) -> None:
        # A floor of 0 (or below, or NaN) never trips, and a limit of 0 skips trips at once:
        # either would make the guard a lie.
        scale = self.min_scale
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not (0 < scale <= FLOAT32_MAX)
        ):
            raise UsageError(
                f"the guard's min_scale must be a finite number > 0, got {shown(scale)}"
            )
        for name in ("max_consecutive_skips", "check_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"the guard's {name} must be an integer >= 1, got {shown(value)}")


def check_guard(
    guard: Guard,
    *,
    scale: float,
    streak: int,
    step: int,
    islands: tuple[str, ...],
    checked: bool = False,
) -> None:
    """:class:`AmpGuardError` when ``scale`` is below the guard's floor or ``streak`` skipped
    steps in a row reach its limit: what was seen (the gradients overflow float16 at every
    scale down to here), the two causes it cannot tell apart without looking at the forward
    (an activation that overflows, or gradients too large for float16), and what to do for
    each, without advising what the config already does (with islands in place, the overflow
    is in another module). The in-run check, where it acts (``checked``), looked first and
    could not set the scale back (:mod:`scalertune._inrun._actions`); where it does not, the
    message says that it would tell the two apart."""
    if scale >= guard.min_scale and streak < guard.max_consecutive_skips:
        return
    fix = (
        f"this config already keeps {','.join(islands)} in float32, so another module "
        f"may overflow: run scalertune diagnose with --fp32-modules '{','.join(islands)}' "
        "to find it, or train in bfloat16"
        if islands
        else "run scalertune diagnose to find the module, then keep it in float32 "
        "(fp32_modules) or train in bfloat16"
    )
    raise AmpGuardError(
        f"AMP guard at step {step}: the loss scale is {scale:.3g} (floor "
        f"{guard.min_scale:.3g}) after {streak} skipped steps in a row "
        f"(limit {guard.max_consecutive_skips}): the gradients overflow float16 at every "
        "scale down to here. Either an activation overflows float16 in the forward pass "
        f"({fix}), or the gradients themselves are too large for float16, as in a burst "
        "of huge losses (lower the learning rate or clip them)"
        + (
            ""
            if checked
            else "; the in-run check (check='act', the default) tells the two apart at the "
            "same weights and sets a scale that collapsed in a burst back"
        )
    )
