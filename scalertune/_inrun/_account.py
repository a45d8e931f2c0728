"""What ``amp.report()`` prints, and what the study shows of a real run: its checks, its
actions and its scaler's story beside the search's prediction. A function of the run's
record (plain data), so that the runtime and ``scalertune report`` print the same text."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def describe(record: Mapping[str, Any]) -> str:
    """The report's lines for a run's record (see
    :meth:`~scalertune._inrun._checker.InRunCheck.record`)."""
    policy = record["policy"]
    checks: Sequence[Sequence[float]] = record.get("checks", [])
    lines = [
        f"In-run check: every {policy['every']} steps, policy '{policy['action']}'; "
        f"{record['steps']:,} steps trained, now {_config(record['config'], record.get('scale'))}"
    ]
    if checks:
        first, last = checks[0], checks[-1]
        worst = max(checks, key=lambda c: _ratio(c[1], c[2]))
        lines.append(
            f"  {len(checks)} checks from step {int(first[0]):,} to {int(last[0]):,}: loss over "
            f"float32's at the same weights {_ratio(last[1], last[2]):.3g}x at the last, "
            f"{_ratio(worst[1], worst[2]):.3g}x at worst (step {int(worst[0]):,})"
        )
    else:
        lines.append("  no check yet (the loss goes through amp.loss or amp.train_step)")
    done = record.get("actions", [])
    # under the policy 'warn' a finding is said and nothing changed: a warning, no action
    actions = [a for a in done if a.get("kind") != "none"]
    warnings = [a for a in done if a.get("kind") == "none"]
    lines.append(f"  actions: {len(actions) or 'none'}")
    lines += [f"    {a['line']}" for a in actions]
    if warnings:
        lines.append(f"  warnings: {len(warnings)}")
        lines += [f"    {a['line']}" for a in warnings]
    lines.append("  " + _scaler(record))
    return "\n".join(lines)


def _scaler(record: Mapping[str, Any]) -> str:
    steps, skipped = int(record["steps"]), int(record.get("skipped_steps", 0))
    dtype = record["config"].get("dtype")
    if dtype in ("bfloat16", "float8", "float32") and "scale" not in record and not skipped:
        why = "torchao scales each float8 tensor itself" if dtype == "float8" else "none needed"
        return f"scaler: none ({dtype}: {why}); {steps:,} steps taken"
    text = f"scaler: skipped {skipped:,} of {steps:,} steps"
    if "scale" in record:
        text += f", scale now {record['scale']:.4g}"
    predicted = record.get("prediction")
    if predicted:
        upto = min(steps, predicted["horizon"])
        share = predicted["skipped_steps"] * upto / predicted["horizon"]
        text += (
            f"; the search predicted {predicted['skipped_steps']:,} over its horizon of "
            f"{predicted['horizon']:,} (about {share:.0f} by step {upto:,}), "
            f"scales {predicted['min_scale']:.3g} to {predicted['final_scale']:.3g}"
        )
    return text


def _config(config: Mapping[str, Any], scale: float | None = None) -> str:
    """The config the run trains with now, at the scale it has now (its ``init_scale`` is
    where the scale started, which the scaler has since moved)."""
    import contextlib
    import dataclasses

    from scalertune._amp._config import AmpConfig
    from scalertune._errors import UsageError

    now = AmpConfig.from_dict(config)
    if scale is not None and now.uses_scaler and math.isfinite(scale) and scale > 0:
        # a scale no config starts at is left as it was (DeepSpeed's are powers of two)
        with contextlib.suppress(UsageError):
            now = dataclasses.replace(now, init_scale=float(scale))
    return now.describe()


def _ratio(ours: float, float32: float) -> float:
    if not math.isfinite(ours):
        return math.inf
    return ours / float32 if float32 else (1.0 if ours == 0 else math.inf)
