"""When a run stops: at the target, or once it cannot win; and how long it may train."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from optuna.trial import FrozenTrial

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._judge._outcome import Outcome
from scalertune._judge._rank import time_bounds
from scalertune._judge._settings import Noise
from scalertune._judge._stopping import Best, Floor, StopRule
from scalertune._judge._target import Target
from scalertune._judge._view import StudyView
from scalertune._search._references import References
from scalertune._search._setup import Setup
from scalertune._storage._names import (
    ROLE_BASELINE,
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_ISLAND,
    ROLE_REPLAY,
    ROLE_SEARCH,
)


class Rules:
    """The stop rule of each run and the steps it may train, from the study's evidence."""

    def __init__(self, setup: Setup, references: References, view: StudyView) -> None:
        self.setup, self.references, self.view = setup, references, view

    def stop_rule(
        self, role: str, config: AmpConfig, target: Target, trials: list[FrozenTrial]
    ) -> StopRule:
        """Search runs, baselines, islands and the replay's choice may be pruned as slower
        than the best, and a float8 config that loses a layer from the first batch on at
        its first window (:meth:`Setup.float8_spoils`); confirmations and float32 with the
        recommendation's clipping only stop at their target (they must show where it is
        reached, not race). When the trial is the horizon, a run that reaches the target
        while float32 still learns trains on until float32 has settled (``run_on``): the
        trial is all the evidence there is. Over a longer horizon the finalists' phases are
        that evidence."""
        run_on = not self.setup.long
        if role in (ROLE_CONFIRM, ROLE_FLOAT32_CLIP):
            return StopRule(target, run_on=run_on)
        spoiled = self.setup.float8_spoils(config)
        if self.setup.long and role != ROLE_SEARCH:
            # the baselines and the proposed configs are finalists-to-be: a config faster to
            # the early target may fall behind later, so they must reach the target themselves
            return StopRule(target, spoiled=spoiled)
        times = self.references.step_times
        step_time = times.bounds(config.dtype) if times and config.dtype in times else None
        best = _best(self.view.outcomes(trials), self.setup.seed, times, self.noise())
        if best is not None and self.setup.long:
            # over a long horizon a run is beaten only by its own dtype: another dtype's
            # faster start says nothing of the late phases, where it may fall behind
            best = dataclasses.replace(best, time_high=math.inf)
        floor = self._floor(role, config)
        return StopRule(
            target, step_time=step_time, best=best, floor=floor, run_on=run_on, spoiled=spoiled
        )

    def _floor(self, role: str, config: AmpConfig) -> Floor | None:
        """A sampled run clipped as the workload clips can reach the target no sooner than
        the float32 reference did, less a tie's margin. Only sampled runs: the baselines and
        the replay's choice are evidence the review reads (the scale's story, the replay's
        check), and run until the best's own time rules them out."""
        if role != ROLE_SEARCH or self.setup.long or config.clip_norm != self.setup.clip_norm:
            return None
        reached = self.references.reference(self.setup.seed).steps_to_target
        if reached is None:
            return None
        return Floor(steps=math.floor(reached - self.noise().margin(reached)), reached=reached)

    def noise(self) -> Noise:
        """What counts as a tie in steps to the target (float32's seed spread of them)."""
        return self.setup.settings.noise(self.references.spread())

    def trial_steps(self, role: str) -> int:
        """How long a run from the start may train: a trial, and over a long horizon a tie's
        margin more for the runs that may become finalists and their confirmations, so that
        a config that loses a few steps at the start (a scale backing off) still reaches the
        early target (on every seed: a confirmation held to fewer steps than the run it
        confirms fails it for what the finalist was allowed)."""
        if not self.setup.long or role == ROLE_FLOAT32_CLIP:
            return self.setup.steps
        unit = _policy.READBACK_INTERVAL
        extra = math.ceil(self.noise().margin(self.setup.steps) / unit) * unit
        return min(self.setup.steps + extra, self.setup.horizon)

    def step_time(self, config: AmpConfig) -> float | None:
        times = self.references.step_times
        return times.median(config.dtype) if times and config.dtype in times else None


def _best(outcomes: list[Outcome], seed: int, times: Any, noise: Noise) -> Best | None:
    """The main-seed runs that reached the target soonest: overall, at the slow end of its
    timing spread, and per dtype in steps."""
    runs = [
        o
        for o in outcomes
        if o.role in (ROLE_SEARCH, ROLE_BASELINE, ROLE_ISLAND, ROLE_REPLAY)
        and o.seed == seed
        and o.reached
        and not o.reused
    ]
    if not runs:
        return None
    steps: dict[str, tuple[int, str]] = {}
    for o in runs:
        dtype, reached_at = o.config.dtype, o.steps_to_target  # set: these runs reached it
        if reached_at is not None and (dtype not in steps or reached_at < steps[dtype][0]):
            steps[dtype] = (reached_at, o.label)
    fastest = min(runs, key=lambda o: time_bounds(o, times, noise)[1])
    return Best(
        time_high=time_bounds(fastest, times, noise)[1],
        label=fastest.label,
        steps=steps,
        margin=noise.margin(min(s for s, _ in steps.values())),
    )
