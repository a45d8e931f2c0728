"""Ranking: which configs reach the float32 target, and which of those gets there first.

Runs that reach the target rank above runs that never do. Among those that do, the shortest
time to target wins: steps to target times the step time of the run's dtype, measured
interleaved with float32's (:mod:`scalertune._run._timing`). Two runs of the same dtype differ only
in steps, which are exact; runs of different dtypes whose times overlap within the timing
spread are **tied**, and a tie goes to the more stable run (fewer skipped steps, then more loss
scale headroom), then the simpler config (fewer knobs away from PyTorch's defaults), never to
noise. A config is *recommended* only after confirmation: rerun on other seeds, it stays
finite and reaches each seed's target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._judge._outcome import Outcome
from scalertune._judge._settings import Noise
from scalertune._run._step_times import StepTimes
from scalertune._storage._names import ROLE_CONFIRM


def time_bounds(
    outcome: Outcome, times: StepTimes | None, noise: Noise = Noise()
) -> tuple[float, float]:
    """The range of a run's time to target: its steps (and, at the top, the noise of steps)
    times its dtype's step-time spread."""
    steps = outcome.steps_to_target
    if steps is None or times is None or outcome.config.dtype not in times:
        return math.inf, math.inf
    low, high = times.bounds(outcome.config.dtype)
    return steps * low, (steps + noise.margin(steps)) * high


def surely_faster(a: Outcome, b: Outcome, times: StepTimes | None, noise: Noise = Noise()) -> bool:
    """Whether ``a`` reaches the target sooner than ``b`` beyond the noise: on the same dtype
    (the same step time) in fewer steps beyond the tie margin; across dtypes with
    time-to-target ranges that do not overlap, or, where their steps to the target tie, with
    step times whose spreads do not overlap (over the horizon, every step costs that). A run
    that never reaches the target is faster than none, and slower than any that does."""
    mine, theirs = a.steps_to_target, b.steps_to_target
    if mine is None or theirs is None:
        return mine is not None
    if a.config.dtype == b.config.dtype:
        return mine + noise.margin(mine) < theirs
    if (
        times is not None
        and a.config.dtype in times
        and b.config.dtype in times
        and abs(mine - theirs) <= noise.margin(max(mine, theirs))
    ):
        # Steps to the target tie: what differs over the horizon is the time of every step.
        return times.bounds(a.config.dtype)[1] < times.bounds(b.config.dtype)[0]
    return time_bounds(a, times, noise)[1] < time_bounds(b, times)[0]


def all_tied(pool: Sequence[Outcome], times: StepTimes | None, noise: Noise = Noise()) -> bool:
    """Whether two or more runs reached the target and none is surely faster than another:
    the comparison cannot tell them apart, and the order is stability, then simplicity."""
    return len(pool) >= 2 and not any(
        surely_faster(a, b, times, noise) for a in pool for b in pool if a is not b
    )


def rank_key(outcome: Outcome) -> tuple[int, float, int]:
    """Reached before never-reached; then time to target, or closeness to float32's loss;
    pruned runs last."""
    if outcome.reached:
        return (0, outcome.time_to_target, outcome.number)
    if outcome.state == "complete":
        ratio = outcome.figures.loss_vs_float32
        return (1, math.inf if ratio is None else float(ratio), outcome.number)
    return (2, math.inf, outcome.number)


def ranked(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Search and baseline runs of the main seed, best first (confirmations and reused
    duplicates excluded)."""
    return sorted((o for o in outcomes if o.role != ROLE_CONFIRM and not o.reused), key=rank_key)


def candidates(
    ranking: Sequence[Outcome],
    times: StepTimes | None,
    clip_norm: float | None,
    noise: Noise = Noise(),
) -> list[Outcome]:
    """Distinct configs that reached the target, in the order they are confirmed.

    The runs that no other run beats beyond the noise come first (the fastest, and the runs
    tied with it), the more stable first (fewer skipped steps, beyond the replay's own
    tolerance of max(2, 20%)), then the simpler (fewer knobs away from PyTorch's defaults),
    then the faster; then the same among the rest, and so on. A run is never tied into the
    first group by another dtype's wide spread while a run of its own dtype reached the target
    in fewer steps beyond the seed spread: that run is surely faster, whatever the timing.
    """
    pool: list[Outcome] = []
    seen: set[AmpConfig] = set()
    for outcome in ranking:
        if outcome.reached and outcome.config not in seen:
            seen.add(outcome.config)
            pool.append(outcome)
    # beaten[j]: how many runs left in the pool are surely faster than run j
    faster = faster_pairs(pool, times, noise)
    beaten = faster.sum(axis=0)
    left = np.ones(len(pool), dtype=bool)
    ordered: list[Outcome] = []
    while left.any():
        unbeaten = left & (beaten == 0)
        group = [pool[i] for i in np.flatnonzero(unbeaten)]
        fewest = min(o.stability[0] for o in group)
        group.sort(
            key=lambda o: (
                o.stability[0] > fewest + skip_tolerance(fewest),
                o.config.knobs_changed(clip_norm),
                o.time_to_target,
                o.number,
            )
        )
        ordered.extend(group)
        left &= ~unbeaten
        beaten -= faster[unbeaten].sum(axis=0)
    return ordered


def faster_pairs(
    runs: Sequence[Outcome], times: StepTimes | None, noise: Noise = Noise()
) -> npt.NDArray[np.bool_]:
    """:func:`surely_faster` of every pair of ``runs`` (runs that reached the target) at once:
    ``[i, j]`` is whether ``runs[i]`` is surely faster than ``runs[j]``, by the same rule in
    the same floating-point operations (the tests check it against :func:`surely_faster`,
    pair by pair). The ranking compares every candidate with every other; one pass over
    arrays keeps that to milliseconds for a study of thousands of runs."""
    steps = np.array([o.steps_to_target for o in runs], dtype=np.float64)
    names = [o.config.dtype for o in runs]
    kinds = np.array([sorted(set(names)).index(n) for n in names], dtype=np.int64)
    timed = np.array([times is not None and n in times for n in names], dtype=bool)
    bounds = {n: times.bounds(n) for n in set(names) if n in times} if times is not None else {}
    # an untimed run's step time is never read (``timed`` masks it): 0, not inf, so that no
    # product of it is NaN
    low = np.array([bounds[n][0] if n in bounds else 0.0 for n in names])
    high = np.array([bounds[n][1] if n in bounds else 0.0 for n in names])
    margin = noise.spread * np.maximum(steps, noise.horizon)
    ahead = steps + margin
    a, b = np.ix_(np.arange(len(runs)), np.arange(len(runs)))
    # the margin of the larger steps: the larger margin (a margin grows with the steps)
    tied = timed[a] & timed[b] & (np.abs(steps[a] - steps[b]) <= np.maximum(margin[a], margin[b]))
    # time to target: at the top with the tie margin, at the bottom without
    top = np.where(timed, ahead * high, math.inf)
    bottom = np.where(timed, steps * low, math.inf)
    return np.where(
        kinds[a] == kinds[b],
        ahead[a] < steps[b],
        np.where(tied, high[a] < low[b], top[a] < bottom[b]),
    )


def skip_tolerance(skips: float) -> float:
    """How many more skipped steps than ``skips`` are still the same: the replay's calibrated
    error, and the run-to-run noise of a skip count."""
    return max(_policy.SKIP_TOLERANCE_STEPS, _policy.SKIP_TOLERANCE_SHARE * skips)


def confirmations_of(outcomes: Sequence[Outcome]) -> dict[int, dict[int, Outcome]]:
    """Candidate's number -> seed -> the confirmation run of its config on that seed (the
    last of ``outcomes``, where one seed has several)."""
    found: dict[int, dict[int, Outcome]] = {}
    for o in outcomes:
        if o.role == ROLE_CONFIRM and o.confirms is not None:
            found.setdefault(o.confirms, {})[o.seed] = o
    return found


def confirmation_state(
    confirmations: dict[int, dict[int, Outcome]], candidate: Outcome, seeds: Sequence[int]
) -> str:
    """Where ``candidate``'s confirmation on the other ``seeds`` stands, by its runs in
    ``confirmations`` (:func:`confirmations_of`): ``"confirmed"``, ``"failed"`` (a seed that
    went non-finite or never reached its target), or ``"pending"`` (a seed not yet run)."""
    runs = confirmations.get(candidate.number, {})
    if any(not o.reached for o in runs.values()):
        return "failed"
    if all(s in runs for s in seeds):
        return "confirmed"
    return "pending"


def next_to_confirm(
    candidates: Sequence[Outcome],
    confirmations: dict[int, dict[int, Outcome]],
    seeds: Sequence[int],
) -> Outcome | None:
    """The first of ``candidates`` whose confirmation is pending, so long as none before it
    was confirmed: the best one, and the next only once every one before it failed."""
    for candidate in candidates:
        state = confirmation_state(confirmations, candidate, seeds)
        if state == "pending":
            return candidate
        if state == "confirmed":
            return None
    return None
