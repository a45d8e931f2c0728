"""A run's outcome in words: what the summary, the notes and the pictures say of it."""

from __future__ import annotations

import shlex
from typing import Any, Mapping, Sequence

from scalertune._judge._outcome import Outcome


def describe_outcome(outcome: Outcome) -> str:
    """One phrase: what happened to this run."""
    if outcome.state == "fail":
        return f"failed: {outcome.attrs.get('error', 'error')}"
    if outcome.state == "pruned":
        return f"pruned: {outcome.attrs.get('prune_reason', 'non-finite')}"
    skipped = outcome.attrs.get("skipped_steps") or 0
    tail = f", {skipped} skipped steps" if skipped else ""
    if outcome.reached:
        return f"reached the float32 target at step {outcome.steps_to_target}{tail}"
    ratio = outcome.attrs.get("loss_vs_float32")
    return (f"never reached the float32 target (loss {float(ratio):.3g}x float32's at step "
            f"{outcome.attrs.get('loss_vs_float32_step')}){tail}"
            if ratio is not None else f"never reached the float32 target{tail}")


def forward_overflow_hint(factory: str, study_name: str, runs: Sequence[Mapping[str, Any]],
                          space: str | None = None) -> str:
    """What to do when every float16 run of a search overflowed in the forward pass.

    ``runs`` are those runs' attributes: ``overflow_islands`` (what to keep in float32, the
    config's own islands included, checked to make the forward finite) and
    ``overflow_module`` (where it overflowed), as :func:`locate_forward_overflow` found them.
    The command printed is one that was checked: followed once, its float16 trials no longer
    overflow there.
    """
    fixes = [r["overflow_islands"] for r in runs if r.get("overflow_islands")]
    if not fixes:
        return ("Every float16 trial overflowed in the forward pass: no scaler setting "
                "fixes that. Use bfloat16, or find the modules with scalertune diagnose "
                f"{factory}.")
    islands = max(fixes, key=fixes.count)
    where = next(r.get("overflow_module") for r in runs if r.get("overflow_islands") == islands)
    base = (space or "default").split("+fp32:")[0]
    space_arg = f" --space {base}" if base in ("float16", "bfloat16") else ""
    return (f"Every float16 trial overflowed in the forward pass (in {where}): no scaler "
            f"setting fixes that. Use bfloat16, or keep these modules in float32 (checked: "
            f"the forward is finite with them): scalertune search {factory}{space_arg} "
            f"--fp32-modules {shlex.quote(islands)} "
            f"--study-name {shlex.quote(study_name + '+fp32')}")
