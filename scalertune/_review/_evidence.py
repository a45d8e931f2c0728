"""How the horizon's evidence for a run was taken, and why a run does not hold, in words."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scalertune._judge._horizon import behind_from, ruling
from scalertune._judge._outcome import Outcome

if TYPE_CHECKING:
    from scalertune._review._result import SearchResult


def evidence_of(result: "SearchResult", outcome: Outcome) -> str:
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
        how = (f"trained from step 0 through the {ran[-1].start}-{ran[-1].end} window and "
               "branched after")
    else:
        how = ("branched from float32's checkpoints (the cost cap left no room to train "
               "it from step 0)")
    return f"holds at every phase of the horizon, {how}"


def why_not(result: "SearchResult", outcome: Outcome) -> str:
    """Where ``outcome``'s config stopped holding, in words (see :meth:`SearchResult.holds`)."""
    done = result.phases.get(outcome.number, [])
    rule = ruling(outcome, done, result.ruled)
    if rule is not None:
        dtype = outcome.config.dtype
        if rule.stalled:
            return (f"{dtype} trained from step 0 (trial #{rule.number}) fell behind "
                    f"float32 by {rule.start}-{rule.end} although its forward keeps up at "
                    f"float32's own weights of step {rule.forward_at}: it stalls on the way, "
                    f"which a branch of {dtype} cannot show")
        return (f"{dtype} (trial #{rule.number}) fell behind float32 "
                f"by {rule.start}-{rule.end}, and its forward at float32's own weights of "
                f"step {rule.forward_at} is {rule.forward:.3g}x float32's loss: the precision "
                "fails, for this config too (a clip does not change it)")
    return behind_from(done)
