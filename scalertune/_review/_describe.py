"""A search's runs and findings in words: what the summary, the notes, the pictures and the
YAML say of a run's outcome, of how its evidence over the horizon was taken and why it does
not hold, of a forward overflow, and of the forecast past the horizon."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from scalertune._judge._findings import Findings
from scalertune._judge._horizon import behind_from, precision, ruling
from scalertune._judge._outcome import Outcome
from scalertune._replay._forecast import forecast


def unjudged(result: Findings) -> str:
    """The word for a finalist without its evidence over the horizon, in the summary, the
    pictures and the notes alike: "not run" once one before it held and was confirmed (the
    answer takes them in order, and needs no more), else "pending" (still to come)."""
    return "not run" if result.best_amp is not None else "pending"


def describe_outcome(outcome: Outcome) -> str:
    """One phrase: what happened to this run."""
    if outcome.state == "fail":
        return f"failed: {'error' if outcome.error is None else outcome.error}"
    if outcome.state == "pruned":
        return f"pruned: {'non-finite' if outcome.prune_reason is None else outcome.prune_reason}"
    skipped = outcome.figures.skipped_steps or 0
    tail = f", {skipped} skipped steps" if skipped else ""
    if outcome.reached:
        return f"reached the float32 target at step {outcome.steps_to_target}{tail}"
    ratio = outcome.figures.loss_vs_float32
    return (
        f"never reached the float32 target (loss {float(ratio):.3g}x float32's at step "
        f"{outcome.figures.loss_vs_float32_step}){tail}"
        if ratio is not None
        else f"never reached the float32 target{tail}"
    )


def forward_overflow_hint(
    factory: str, study_name: str, runs: Sequence[Outcome], space: str | None = None
) -> str:
    """What to do when every float16 run of a search overflowed in the forward pass.

    ``runs`` are those runs: their ``overflow_islands`` (what to keep in float32, the
    config's own islands included, checked to make the forward finite) and
    ``overflow_module`` (where it overflowed), as
    :func:`~scalertune._diagnose._locate.locate_forward_overflow` found them.
    The command printed is one that was checked: followed once, its float16 trials no longer
    overflow there.
    """
    fixes = [r.overflow_islands for r in runs if r.overflow_islands]
    if not fixes:
        return (
            "Every float16 trial overflowed in the forward pass: no scaler setting "
            "fixes that. Use bfloat16, or find the modules with scalertune diagnose "
            f"{factory}."
        )
    islands = max(fixes, key=fixes.count)
    where = next(r.overflow_module for r in runs if r.overflow_islands == islands)
    base = (space or "default").split("+fp32:")[0]
    space_arg = f" --space {base}" if base in ("float16", "bfloat16") else ""
    return (
        f"Every float16 trial overflowed in the forward pass (in {where}): no scaler "
        f"setting fixes that. Use bfloat16, or keep these modules in float32 (checked: "
        f"the forward is finite with them): scalertune search {factory}{space_arg} "
        f"--fp32-modules {shlex.quote(islands)} "
        f"--study-name {shlex.quote(study_name + '+fp32')}"
    )


def evidence_of(result: Findings, outcome: Outcome) -> str:
    """How the horizon's evidence for ``outcome`` was taken: ``holds at every phase of the
    horizon, trained from step 0 through the 1000-1200 window and branched after`` (empty
    for a short horizon, where the trial is the evidence)."""
    if not result.long:
        return ""
    done = result.phases.get(outcome.number, [])
    ran = [p for p in done if p.from_start]
    if ran and len(ran) == len(done):
        how = "trained from step 0 through every window"
    elif ran:
        how = (
            f"trained from step 0 through the {ran[-1].start}-{ran[-1].end} window and "
            "branched after"
        )
    else:
        how = (
            "branched from float32's checkpoints (the cost cap left no room to train "
            "it from step 0)"
        )
    return f"holds at every phase of the horizon, {how}"


def why_not(result: Findings, outcome: Outcome) -> str:
    """Where ``outcome``'s config stopped holding, in words (see :meth:`Findings.holds`)."""
    done = result.phases.get(outcome.number, [])
    rule = ruling(outcome, done, result.ruled)
    if rule is not None:
        dtype = precision(outcome.config)
        if rule.stalled:
            return (
                f"{dtype} trained from step 0 (trial #{rule.number}) fell behind "
                f"float32 by {rule.start}-{rule.end} although its forward keeps up at "
                f"float32's own weights of step {rule.forward_at}: it stalls on the way, "
                f"which a branch of {dtype} cannot show"
            )
        return (
            f"{dtype} (trial #{rule.number}) fell behind float32 "
            f"by {rule.start}-{rule.end}, and its forward at float32's own weights of "
            f"step {rule.forward_at} is {rule.forward:.3g}x float32's loss: the precision "
            "fails, for this config too (a clip does not change it)"
        )
    said = behind_from(done)
    if (
        not all(p.holds for p in done)
        and not any(p.nonfinite or p.from_start for p in done)
        and outcome.config.clip_norm != result.settings.clip_norm
    ):
        # a branch starts from float32's state, trained at the workload's own clip
        said += (
            ", in branches from float32's checkpoints, where its clip takes over mid-run (a "
            "run from step 0 clips from the start and may not fall behind: the cost cap left "
            "no room to train it so)"
        )
    return said


def overflow_hint(result: Findings) -> str | None:
    """What to do when every float16 trial of the search overflowed in the forward pass
    (:func:`forward_overflow_hint`); ``None`` otherwise."""
    if result.forward_overflow_modules is None:
        return None
    runs = [o for o in result.ranking if o.config.dtype == "float16"]
    return forward_overflow_hint(
        result.settings.factory or "FACTORY",
        result.study_name,
        runs,
        space=result.settings.space_name or None,
    )


def forecast_line(result: Findings) -> str | None:
    """Beyond the horizon: the first module whose forward peaks, at their trend, would reach
    float16's range, and when; ``None`` where no trend is significant, or the space searches
    no float16."""
    trace = result.trace
    if trace is None or "float16" not in result.settings.space_dtypes:
        return None  # float16's range limits nothing the space searches
    found = forecast(trace, result.horizon)
    return f"Forecast beyond the horizon: {found[0].describe()}" if found else None
