"""What ``amp.report()`` prints, and what the study shows of a real run: its checks, its
actions and its scaler's story beside the search's prediction. A function of the run's
record (:class:`~scalertune._inrun._run_record.RunRecord`), so that the runtime and ``scalertune
report`` print the same text."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re

from scalertune._amp._config import AmpConfig
from scalertune._errors import UsageError
from scalertune._inrun._run_record import RunRecord

#: An action line that acts on a float8 layer's own evidence (``LayerCast.line``).
_PER_LAYER = re.compile(r": float8 \w+, layer '")


def describe(record: RunRecord) -> str:
    """The report's lines for a run's record (see
    :meth:`~scalertune._inrun._checker.InRunCheck.summary`)."""
    policy, checks = record.policy, record.checks
    lines = [
        f"In-run check: every {policy.every} steps, policy '{policy.action}'; "
        f"{record.steps:,} steps trained, now {_config(record.config, record.scale)}"
    ]
    if checks:
        first, last = checks[0], checks[-1]
        worst = max(checks, key=lambda c: c.ratio)
        when = (
            f"1 check at step {first.step:,}"
            if len(checks) == 1
            else f"{len(checks)} checks from step {first.step:,} to {last.step:,}"
        )
        lines.append(
            f"  {when}: loss over float32's at the same weights {last.ratio:.3g}x at the "
            f"last, {worst.ratio:.3g}x at worst (step {worst.step:,})"
        )
    else:
        lines.append("  no check yet (the loss goes through amp.loss or amp.train_step)")
    # under the policy 'warn' a finding is said and nothing changed: a warning, no action
    actions = [a for a in record.actions if a.kind != "none"]
    warnings = [a for a in record.actions if a.kind == "none"]
    # a float8 layer spoiled is acted on at once, whatever the loss says: said, so that the
    # loss figures above do not read as contradicting the actions
    per_layer = sum(bool(_PER_LAYER.search(a.line)) for a in actions)
    lines.append(
        f"  actions: {len(actions) or 'none'}"
        + (
            f" ({per_layer} on what float8 did to a layer, whatever the loss showed)"
            if per_layer
            else ""
        )
    )
    lines += [f"    {a.line}" for a in actions]
    if warnings:
        lines.append(f"  warnings: {len(warnings)}")
        lines += [f"    {a.line}" for a in warnings]
    lines.append("  " + _scaler(record))
    return "\n".join(lines)


def _scaler(record: RunRecord) -> str:
    steps, skipped, dtype = record.steps, record.skipped_steps, record.config.dtype
    if dtype in ("bfloat16", "float8", "float32") and record.scale is None and not skipped:
        why = "torchao scales each float8 tensor itself" if dtype == "float8" else "none needed"
        return f"scaler: none ({dtype}: {why}); {steps:,} steps taken"
    text = f"scaler: skipped {skipped:,} of {steps:,} steps"
    if record.scale is not None:
        text += f", scale now {record.scale:.4g}"
    predicted = record.prediction
    if predicted is not None:
        upto = min(steps, predicted.horizon)
        share = predicted.skipped_steps * upto / predicted.horizon
        text += (
            f"; the search predicted {predicted.skipped_steps:,} over its horizon of "
            f"{predicted.horizon:,} (about {share:.0f} by step {upto:,}), "
            f"scales {predicted.min_scale:.3g} to {predicted.final_scale:.3g}"
        )
    return text


def _config(config: AmpConfig, scale: float | None = None) -> str:
    """The config the run trains with now, at the scale it has now (its ``init_scale`` is
    where the scale started, which the scaler has since moved)."""
    now = config
    if scale is not None and now.uses_scaler and math.isfinite(scale) and scale > 0:
        # a scale no config starts at is left as it was (DeepSpeed's are powers of two)
        with contextlib.suppress(UsageError):
            now = dataclasses.replace(now, init_scale=float(scale))
    return now.describe()
