"""Judging for the horizon: which configs hold over it, the finalists, and the noise.

A config **holds for the horizon** when its short trial reached the target and, over a horizon
longer than a trial, its branch at every phase window stayed finite and did not fall behind
float32 (:mod:`scalertune._judge._phases`). The **finalists** are the candidates that get those
branches. The **seed spread** is how far float32's own steps to its target move from seed to
seed: two runs of one dtype whose steps to the target differ by less are tied, and a tie goes
to the simpler config.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from optuna.trial import FrozenTrial, TrialState

from scalertune import _policy
from scalertune._judge._outcome import Outcome
from scalertune._judge._phases import PhaseResult
from scalertune._storage._names import JUDGED_ATTR, ROLE_BASELINE, ROLE_PHASE


def phases_of(trials: Iterable[FrozenTrial]) -> dict[int, list[PhaseResult]]:
    """Run number -> how its branches did, window by window (finished branches only)."""
    out: dict[int, list[PhaseResult]] = {}
    for trial in trials:
        attrs = trial.user_attrs
        if attrs.get("role") != ROLE_PHASE or trial.state not in (TrialState.COMPLETE,
                                                                  TrialState.PRUNED):
            continue
        judged = trial.system_attrs.get(JUDGED_ATTR, {})
        if "phase_ratio" not in judged:
            continue
        out.setdefault(int(attrs["of"]), []).append(PhaseResult(
            start=int(attrs["start"]), end=int(attrs["end"]),
            ratio=_float(judged["phase_ratio"]), z=_float(judged["phase_z"]),
            nonfinite=bool(judged["phase_nonfinite"])))
    for results in out.values():
        results.sort(key=lambda p: p.start)
    return out


def _float(value: Any) -> float:
    return math.inf if value is None else float(value)


def holds(outcome: Outcome, phases: dict[int, list[PhaseResult]],
          windows: Sequence[tuple[int, int]]) -> bool | None:
    """Whether ``outcome``'s config holds for the horizon: ``None`` while a window's branch
    has not run (``True`` at once when there are no windows: the trial is the evidence)."""
    if not outcome.reached:
        return False
    if not windows:
        return True
    done = {p.start: p for p in phases.get(outcome.number, [])}
    if any(not p.holds for p in done.values()):
        return False
    return True if all(start in done for start, _ in windows) else None


def seed_spread(steps_by_seed: Sequence[int | None]) -> float:
    """How far float32's steps to its own target move between seeds, as a share of the
    fewest: ``(max - min) / min`` over the seeds that reached it, at least
    ``SEED_SPREAD_FLOOR``."""
    steps = [s for s in steps_by_seed if s]
    if len(steps) < 2:
        return _policy.SEED_SPREAD_FLOOR
    return max(_policy.SEED_SPREAD_FLOOR, (max(steps) - min(steps)) / min(steps))


def fewer_steps(a: int, b: int, spread: float) -> bool:
    """Whether ``a`` steps to the target is fewer than ``b`` beyond the seed spread."""
    return a * (1 + spread) < b


def finalists(candidates: Sequence[Outcome], ranking: Sequence[Outcome],
              clip_norm: float | None = None) -> list[Outcome]:
    """The runs branched at the phases, at most ``PHASE_FINALISTS``: PyTorch's defaults when
    they reached the target, then the first candidate of each family (its dtype, and whether
    it clips otherwise than the workload: a clip that helps early may hurt late, so the best
    unclipped run of a dtype must be seen too), then the next candidates in order."""
    defaults = next((o for o in ranking if o.role == ROLE_BASELINE
                     and o.attrs.get("baseline") == "pytorch-default" and o.reached), None)
    chosen: list[Outcome] = [defaults] if defaults is not None else []
    families = {_family(o, clip_norm) for o in chosen}
    for c in candidates:
        if _family(c, clip_norm) not in families and all(c.config != o.config for o in chosen):
            families.add(_family(c, clip_norm))
            chosen.append(c)
    chosen += [c for c in candidates if all(c.config != o.config for o in chosen)]
    return chosen[:_policy.PHASE_FINALISTS]


def _family(outcome: Outcome, clip_norm: float | None) -> tuple[str, bool]:
    return outcome.config.dtype, outcome.config.clip_norm != clip_norm


def behind_from(results: Sequence[PhaseResult]) -> str:
    """Where a config stopped holding, in words: ``falls behind float32 by 1000-1200: 1.9x at
    1000-1200, 4.3x at 1800-2000`` (its loss over float32's, window by window)."""
    failed = [p for p in results if not p.holds]
    if not failed:
        return "holds at every phase"
    first = failed[0]
    verb = "goes non-finite" if first.nonfinite else "falls behind float32"
    return f"{verb} by {first.start}-{first.end}: " + ", ".join(p.describe() for p in results)

