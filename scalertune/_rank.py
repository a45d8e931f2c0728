"""Ranking: which configs reach the float32 target, and which of those gets there first.

Trials that reach the target rank above trials that never do; among those that do, the
shortest time to target (steps to target x median step time) wins. Among those that never
do, the one whose final loss is closest to float32's ranks first. A config is *recommended*
only after confirmation: rerun on other seeds, it stays finite and reaches each seed's target.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable, Sequence

from optuna.trial import FrozenTrial, TrialState

from scalertune._config import AmpConfig

ROLE_SEARCH, ROLE_BASELINE, ROLE_CONFIRM = "search", "baseline", "confirm"
_AMP_ROLES = (ROLE_SEARCH, ROLE_BASELINE, ROLE_CONFIRM)

#: Trial system attribute holding the per-step loss scale, run-length encoded as
#: ``[[scale, steps], ...]`` (the scale is piecewise constant). A system attribute, so that the
#: dashboard's table of user attributes stays readable.
SCALES_ATTR = "scalertune.scales"


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
        attrs = dict(trial.user_attrs)
        steps = sorted(trial.intermediate_values)
        return cls(
            number=trial.number,
            role=attrs.get("role", ROLE_SEARCH),
            config=AmpConfig.from_dict(attrs["config"]),
            seed=int(attrs.get("seed", 0)),
            state=trial.state.name.lower(),
            attrs=attrs,
            losses=tuple(trial.intermediate_values[s] for s in steps),
            scales=decode_scales(trial.system_attrs.get(SCALES_ATTR, [])),
        )

    @property
    def label(self) -> str:
        if self.role == ROLE_BASELINE:
            return self.attrs["baseline"]
        if self.role == ROLE_CONFIRM:
            return f"#{self.attrs['confirms']} seed {self.seed}"
        return f"trial #{self.number}"

    @property
    def reached(self) -> bool:
        return self.state == "complete" and self.attrs.get("steps_to_target") is not None

    @property
    def time_to_target(self) -> float:
        value = self.attrs.get("time_to_target_s")
        return math.inf if value is None else float(value)

    @property
    def loss_vs_float32(self) -> float:
        value = self.attrs.get("loss_vs_float32")
        return math.inf if value is None else float(value)

    @property
    def prune_kind(self) -> str | None:
        return self.attrs.get("pruned_because")


def outcomes_of(trials: Iterable[FrozenTrial]) -> list[Outcome]:
    """Finished AMP runs (complete or pruned), in trial-number order; the float32 reference
    trials are the yardstick, not candidates, and are left out."""
    done = (TrialState.COMPLETE, TrialState.PRUNED)
    return [Outcome.from_trial(t) for t in trials
            if t.state in done and t.user_attrs.get("role") in _AMP_ROLES]


def rank_key(outcome: Outcome) -> tuple[int, float, int]:
    """Reached before never-reached; then time to target, or closeness to float32's loss."""
    if outcome.reached:
        return (0, outcome.time_to_target, outcome.number)
    if outcome.state == "complete":
        return (1, outcome.loss_vs_float32, outcome.number)
    return (2, math.inf, outcome.number)


def ranked(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Search and baseline runs of the main seed, best first (confirmation runs excluded)."""
    return sorted((o for o in outcomes if o.role != ROLE_CONFIRM), key=rank_key)


def distinct_candidates(ranking: Sequence[Outcome], top: int) -> list[Outcome]:
    """The best ``top`` runs that reached the target, one per distinct config."""
    seen: set[AmpConfig] = set()
    picked = []
    for outcome in ranking:
        if not outcome.reached or outcome.config in seen:
            continue
        seen.add(outcome.config)
        picked.append(outcome)
        if len(picked) == top:
            break
    return picked


def confirmations_of(candidate: Outcome, outcomes: Sequence[Outcome]) -> dict[int, Outcome]:
    """Seed -> the confirmation run of ``candidate``'s config on that seed."""
    return {
        o.seed: o for o in outcomes
        if o.role == ROLE_CONFIRM and o.attrs.get("confirms") == candidate.number
    }
