"""Phases of the horizon: where a config is branched from the float32 reference, and whether
it holds there.

A short trial covers the first ``steps`` of training; failures that only show late
(bfloat16's 8 significant bits stopping the fit once float32 learns fine detail, a clip that
helps early and hurts late, activations that grow until float16's range runs out) need
evidence from the late phases themselves. The float32 reference trains to the horizon once
and keeps checkpoints at the start of each phase window (the study's
:attr:`~scalertune._judge._settings.StudySettings.windows`); a finalist config is branched
from each for the window and compared with float32's own continuation, the reference itself,
over the same batches. The comparison is paired, step by step, over the last half of the
window (the first half lets the branch settle into the config): the branch **falls behind**
when its mean loss exceeds float32's by more than ``PHASE_TOLERANCE`` of it and by more than
``PHASE_Z`` standard errors of the paired difference; it **goes non-finite** when the branch
is pruned for a non-finite value or more than ``PHASE_NONFINITE_SHARE`` of its losses are
inf/NaN (a few are GradScaler's skipped steps).

A branch shows whether a config can *follow* float32 from float32's state; it cannot show
whether the config *reaches* that state (a run that stalls on a plateau of its own early on),
and a clipped config branched from unclipped float32 measures a switch to clipping mid-run.
So the config the search would answer with is trained **from step 0** to the horizon instead
(:func:`judge_from_start`): the same windows, judged the same way, against the reference's
losses at the same steps (the same seed, so the same batches).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence

from scalertune import _policy
from scalertune._inrun._gap import falls_behind, relative, z_score


@dataclasses.dataclass(frozen=True)
class PhaseResult:
    """How one branch did against float32 over one window."""

    start: int
    end: int
    #: The branch's mean loss over float32's, over the last half of the window.
    ratio: float
    #: The excess over float32, in standard errors of the paired difference.
    z: float
    nonfinite: bool
    #: Whether the run was trained from step 0 (not branched from float32's checkpoint).
    from_start: bool = False
    #: A run from step 0 that went non-finite: the step it did so at.
    at: int | None = None

    @property
    def behind(self) -> bool:
        return falls_behind(self.ratio, self.z)

    @property
    def holds(self) -> bool:
        return not self.nonfinite and not self.behind

    def describe(self) -> str:
        """``1.9x at 1000-1200`` (its loss over float32's) or ``non-finite at 1800-2000``."""
        where = f"{self.start}-{self.end}"
        if self.nonfinite:
            return (
                f"non-finite at step {self.at}"
                if self.at is not None
                else (f"non-finite at {where}")
            )
        return f"{self.ratio:.3g}x at {where}"


def judge_phase(
    branch: Sequence[float],
    reference: Sequence[float],
    *,
    start: int,
    pruned: bool,
    first_half: bool = False,
) -> PhaseResult:
    """Compare a branch's per-step losses with float32's over the same steps (``reference``,
    the reference's losses over the window), over the window's last half, or its first
    (``first_half``: a run from step 0 that stops inside the window, see
    :func:`judged_end`)."""
    end, half = start + len(reference), len(reference) // 2
    needed = half if first_half else len(reference)
    bad = sum(not math.isfinite(v) for v in branch[:needed])
    if pruned or len(branch) < needed or bad > _policy.PHASE_NONFINITE_SHARE * needed:
        return PhaseResult(start, end, math.inf, math.inf, nonfinite=True)
    ours, theirs = (
        (branch[:half], reference[:half]) if first_half else (branch[half:], reference[half:])
    )
    pairs = [(b, r) for b, r in zip(ours, theirs) if math.isfinite(b)]
    mean_ref = statistics.fmean(r for _, r in pairs)
    diffs = [b - r for b, r in pairs]
    excess = statistics.fmean(diffs)
    return PhaseResult(
        start,
        end,
        ratio=relative(mean_ref + excess, mean_ref),
        z=_z(diffs, excess),
        nonfinite=False,
    )


def _z(diffs: list[float], mean: float) -> float:
    """``mean`` over the standard error of the paired differences, taken from the means of
    consecutive blocks of ``READBACK_INTERVAL`` steps (neighbouring steps are correlated)."""
    block = _policy.READBACK_INTERVAL
    means = [
        statistics.fmean(diffs[i : i + block])
        for i in range(0, len(diffs), block)
        if len(diffs[i : i + block]) == block
    ]
    return z_score(means, mean)


def judged_end(start: int, end: int) -> int:
    """The last step a run from step 0 needs for the window ``start``-``end``: the first half
    of it. A branch is judged on the window's last half, its first letting it settle into its
    config; a run from step 0 has nothing to settle into, and one that stops in the window
    is judged on as many steps, the first half (one that goes on past the window's end, on
    the last half, like a branch: the horizon's end is what the user's run is judged by)."""
    return start + (end - start) // 2


def judge_from_start(
    losses: Sequence[float],
    windows: Mapping[int, Sequence[float]],
    spans: Sequence[tuple[int, int]],
    *,
    pruned: bool,
    first_nonfinite: int | None = None,
) -> list[PhaseResult]:
    """Judge a run trained from step 0 at each window of ``spans`` it got to (``windows``: the
    reference's losses over each, by first step), in order: on the window's last half where
    the run got to its end (as a branch is judged), else on its first half
    (:func:`judged_end`); the list stops at the first window that does not hold. A
    run cut off before a window (pruned for a non-finite value) goes non-finite there, at
    ``first_nonfinite``."""
    out: list[PhaseResult] = []
    for start, end in spans:
        reference, need = windows.get(start), judged_end(start, end)
        if reference is None:
            break
        if len(losses) < need:
            if pruned:
                out.append(
                    PhaseResult(
                        start,
                        end,
                        math.inf,
                        math.inf,
                        nonfinite=True,
                        from_start=True,
                        at=first_nonfinite,
                    )
                )
            break
        judged = judge_phase(
            losses[start:end], reference, start=start, pruned=False, first_half=len(losses) < end
        )
        out.append(dataclasses.replace(judged, from_start=True))
        if not judged.holds:
            break
    return out
