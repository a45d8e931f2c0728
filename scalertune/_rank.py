"""Ranking: which configs reach the float32 target, and which of those gets there first.

Runs that reach the target rank above runs that never do. Among those that do, the shortest
time to target wins: steps to target times the step time of the run's dtype, measured
interleaved with float32's (:mod:`scalertune._timing`). Two runs of the same dtype differ only
in steps, which are exact; runs of different dtypes whose times overlap within the timing
spread are **tied**, and a tie goes to the more stable run (fewer skipped steps, then more loss
scale headroom), then the simpler config (fewer knobs away from PyTorch's defaults), never to
noise. A config is *recommended* only after confirmation: rerun on other seeds, it stays
finite and reaches each seed's target.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Sequence

from optuna.trial import FrozenTrial, TrialState

from scalertune import _policy
from scalertune._config import AmpConfig
from scalertune._timing import StepTimes

ROLE_REFERENCE, ROLE_SEARCH, ROLE_BASELINE = "reference", "search", "baseline"
ROLE_CONFIRM, ROLE_RECOMMENDED = "confirm", "recommended"
#: float32 with the recommended config's clipping: what the clipping alone does.
ROLE_FLOAT32_CLIP = "float32-clip"
_RUN_ROLES = (ROLE_SEARCH, ROLE_BASELINE, ROLE_CONFIRM)

#: Trial system attributes holding a run's per-step loss, and its per-step loss scale
#: run-length encoded as ``[[scale, steps], ...]`` (the scale is piecewise constant). System
#: attributes keep the dashboard's table of user attributes readable; the dashboard's curves
#: are the per-window values reported relative to the target.
LOSSES_ATTR = "scalertune.losses"
SCALES_ATTR = "scalertune.scales"
#: A run's judged attributes in full precision, and a failed run's traceback.
JUDGED_ATTR = "scalertune.judged"
TRACEBACK_ATTR = "scalertune.traceback"


def encode_scales(scales: Sequence[float]) -> list[list[float]]:
    runs: list[list[float]] = []
    for value in scales:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    return runs


def decode_scales(runs: Sequence[Sequence[float]]) -> tuple[float, ...]:
    return tuple(value for value, count in runs for _ in range(int(count)))


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One finished run as the study stores it: a trial plus its judged attributes."""

    number: int
    role: str
    config: AmpConfig
    seed: int
    state: str
    attrs: dict[str, Any]
    losses: tuple[float, ...]
    scales: tuple[float, ...] = ()

    @classmethod
    def from_trial(cls, trial: FrozenTrial) -> "Outcome":
        # the judged figures in full precision over the rounded copies the dashboard shows
        attrs = {**trial.user_attrs, **trial.system_attrs.get(JUDGED_ATTR, {}),
                 **({"traceback": trial.system_attrs[TRACEBACK_ATTR]}
                    if TRACEBACK_ATTR in trial.system_attrs else {})}
        return cls(
            number=trial.number,
            role=attrs.get("role", ROLE_SEARCH),
            config=AmpConfig.from_dict(attrs["config"]),
            seed=int(attrs.get("seed", 0)),
            state=trial.state.name.lower(),
            attrs=attrs,
            losses=tuple(trial.system_attrs.get(LOSSES_ATTR, ())),
            scales=decode_scales(trial.system_attrs.get(SCALES_ATTR, [])),
        )

    @property
    def label(self) -> str:
        if self.role == ROLE_BASELINE:
            return self.attrs["baseline"]
        if self.role == ROLE_CONFIRM:
            return f"#{self.attrs['confirms']} seed {self.seed}"
        if self.role == ROLE_FLOAT32_CLIP:
            return f"float32, clip {self.config.clip_norm:.3g}"
        return f"trial #{self.number}"

    @property
    def reached(self) -> bool:
        return self.state == "complete" and self.steps_to_target is not None

    @property
    def steps_to_target(self) -> int | None:
        value = self.attrs.get("steps_to_target")
        return None if value is None else int(value)

    @property
    def time_to_target(self) -> float:
        value = self.attrs.get("time_to_target_s")
        return math.inf if value is None else float(value)

    @property
    def prune_kind(self) -> str | None:
        return self.attrs.get("pruned_because")

    @property
    def reused(self) -> bool:
        """A sampled config that had run already: its result was copied, nothing trained."""
        return "duplicate_of" in self.attrs

    @property
    def steps_run(self) -> int:
        return 0 if self.reused else int(self.attrs.get("steps_run") or 0)

    @property
    def stability(self) -> tuple[int, float]:
        """Lower is more stable: skipped steps, then how close the loss scale came to the
        collapse floor (runs without a scaler have all the headroom there is)."""
        skipped = int(self.attrs.get("skipped_steps") or 0)
        low = self.attrs.get("min_scale")
        if not self.config.uses_scaler or not low:
            return skipped, -math.inf
        return skipped, -math.log2(float(low) / _policy.SCALE_FLOOR)


def outcomes_of(trials: Iterable[FrozenTrial]) -> list[Outcome]:
    """Finished AMP runs (complete or pruned), in trial-number order; the float32 reference
    trials are the yardstick, not candidates, and are left out."""
    done = (TrialState.COMPLETE, TrialState.PRUNED)
    return [Outcome.from_trial(t) for t in trials
            if t.state in done and t.user_attrs.get("role") in _RUN_ROLES]


def time_bounds(outcome: Outcome, times: StepTimes | None) -> tuple[float, float]:
    """The spread of a run's time to target: steps times its dtype's step-time spread."""
    steps = outcome.steps_to_target
    if steps is None or times is None or outcome.config.dtype not in times:
        return math.inf, math.inf
    low, high = times.bounds(outcome.config.dtype)
    return steps * low, steps * high


def surely_faster(a: Outcome, b: Outcome, times: StepTimes | None) -> bool:
    """Whether ``a`` reaches the target sooner than ``b`` beyond measurement noise: in fewer
    steps on the same dtype (same step time), or with time-to-target spreads that do not
    overlap."""
    if a.config.dtype == b.config.dtype:
        return a.steps_to_target < b.steps_to_target
    return time_bounds(a, times)[1] < time_bounds(b, times)[0]


def tied(a: Outcome, b: Outcome, times: StepTimes | None) -> bool:
    """Whether two runs that reached the target are equally fast within measurement noise:
    neither is surely faster (same dtype: equal steps; different dtypes: spreads overlap)."""
    return not surely_faster(a, b, times) and not surely_faster(b, a, times)


def rank_key(outcome: Outcome) -> tuple[int, float, int]:
    """Reached before never-reached; then time to target, or closeness to float32's loss;
    pruned runs last."""
    if outcome.reached:
        return (0, outcome.time_to_target, outcome.number)
    if outcome.state == "complete":
        ratio = outcome.attrs.get("loss_vs_float32")
        return (1, math.inf if ratio is None else float(ratio), outcome.number)
    return (2, math.inf, outcome.number)


def ranked(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Search and baseline runs of the main seed, best first (confirmations and reused
    duplicates excluded)."""
    return sorted((o for o in outcomes if o.role != ROLE_CONFIRM and not o.reused),
                  key=rank_key)


def candidates(ranking: Sequence[Outcome], times: StepTimes | None,
               clip_norm: float | None) -> list[Outcome]:
    """Distinct configs that reached the target, in the order they are confirmed.

    The runs that no other run beats beyond the noise come first (the fastest, and the runs
    tied with it), ordered by stability, then simplicity, then speed; then the same among the
    rest, and so on. A run is never tied into the first group by another dtype's wide spread
    while a run of its own dtype reached the target in fewer steps: that run is surely
    faster, whatever the spreads.
    """
    pool: list[Outcome] = []
    seen: set[AmpConfig] = set()
    for outcome in ranking:
        if outcome.reached and outcome.config not in seen:
            seen.add(outcome.config)
            pool.append(outcome)
    ordered: list[Outcome] = []
    while pool:
        group = [o for o in pool if not any(surely_faster(p, o, times) for p in pool)]
        group.sort(key=lambda o: (o.stability, o.config.knobs_changed(clip_norm),
                                  o.time_to_target, o.number))
        ordered.extend(group)
        pool = [o for o in pool if o not in group]
    return ordered


def confirmations_of(candidate: Outcome, outcomes: Sequence[Outcome]) -> dict[int, Outcome]:
    """Seed -> the confirmation run of ``candidate``'s config on that seed."""
    return {
        o.seed: o for o in outcomes
        if o.role == ROLE_CONFIRM and o.attrs.get("confirms") == candidate.number
    }
