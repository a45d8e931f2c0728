"""Deciding, window by window, whether a run has gone non-finite, and why (the prune reasons)."""

from __future__ import annotations

import math

import torch

from scalertune import _policy
from scalertune._run._record import RunRecord, as_float32
from scalertune._workload._contract import Workload


def judge_window(record: RunRecord, workload: Workload, start: int) -> None:
    """Decide, from the window just read back, whether the run has gone non-finite."""
    losses, scales = record.losses[start:], record.scales[start:]
    bad = [start + j for j, v in enumerate(losses) if not math.isfinite(v)]
    config = record.config
    if bad and (not config.uses_scaler or len(bad) == len(losses)):
        # With a scaler, an occasional inf loss is only a skipped step; a whole window of
        # them is an overflow no scale can reach. Without a scaler, inf/NaN reaches the
        # weights on the very step it appears.
        _judge_loss(record, workload, bad[0])
        return
    if config.uses_scaler:
        _judge_scaler(record, scales, start)


def _judge_loss(record: RunRecord, workload: Workload, first: int) -> None:
    """Why the loss went non-finite at step ``first``: the data, the weights, a divergence,
    or the forward's range."""
    config = record.config
    if first == 0 and record.start == 0 and config.dtype == "float32":
        # no optimizer step has run yet, and float32 has no range to overflow
        mark_pruned(
            record,
            "forward",
            f"the loss is {record.losses[0]} at step 0, before any optimizer step, with "
            "the initial weights: the model's forward, the loss function or the data "
            "produce it (check the batches for NaN/inf, and the loss for a log or "
            "division of zero)",
        )
        return
    if not _parameters_finite(workload.model):
        mark_pruned(
            record,
            "parameters",
            f"weights became non-finite by step {first}: an optimizer step applied "
            "inf/NaN gradients (try clipping or a lower learning rate)",
        )
        return
    finite = [v for v in record.losses[:first] if math.isfinite(v)]
    if len(finite) > _policy.SMOOTHING_STEPS and max(finite[-_policy.SMOOTHING_STEPS :]) > (
        10 * finite[0]
    ):
        mark_pruned(
            record,
            "diverged",
            f"the loss grew from {finite[0]:.4g} to {finite[-1]:.4g} and was "
            f"{record.losses[first]} at step {first} (exploding gradients: try clipping)",
        )
        return
    where = "float16" if config.dtype == "float16" else config.dtype
    mark_pruned(
        record,
        "forward",
        f"forward overflow: the loss is {record.losses[first]} at step {first} with "
        f"finite weights; activations exceed {where}'s range before any loss scale "
        "applies, so no scaler setting fixes it (use bfloat16, or keep the "
        "overflowing module in float32)",
    )


def _judge_scaler(record: RunRecord, scales: list[float], start: int) -> None:
    """Whether the scaler itself has failed: its scale collapsed, or it skips every step."""
    low = min(scales)
    if low < _policy.SCALE_FLOOR:
        step = start + scales.index(low)
        mark_pruned(
            record,
            "scale-collapse",
            f"scale collapse: the loss scale fell to {low:.3g} by step {step}, below "
            "2**-24; gradients are non-finite at every scale, which points to an overflow "
            "in the forward pass",
        )
        return
    streak = _trailing_skip_streak(record)
    if streak >= _policy.MAX_CONSECUTIVE_SKIPS:
        last = record.steps_run - 1
        mark_pruned(
            record,
            "gradients",
            f"gradients non-finite on every step from step {last - streak + 1} to {last} "
            f"({streak} skipped in a row); the scaler backed off to {scales[-1]:.3g} "
            "without recovering",
        )


def _trailing_skip_streak(record: RunRecord) -> int:
    """The skipped steps in a row that end the run so far, read backwards from its last
    scale: the window's work, not the whole run's (``record.skipped`` rescans every step)."""
    if record.skipped_at is not None:  # an engine's: read off its own flags
        streak, last = 0, record.steps_run - 1
        for index in reversed(record.skipped_at):
            if index != last - streak:
                break
            streak += 1
        return streak
    scales, config = record.scales, record.config
    first = as_float32(config.init_scale if record.initial_scale is None else record.initial_scale)
    streak = 0
    for i in range(len(scales) - 1, -1, -1):
        if not scales[i] < (scales[i - 1] if i else first):
            break
        streak += 1
    return streak


def _parameters_finite(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def mark_pruned(record: RunRecord, kind: str, reason: str) -> None:
    """Mark ``record`` pruned: its kind (:data:`~scalertune._run._record.PRUNE_KINDS`) and why."""
    record.prune_kind = kind
    record.prune_reason = reason
