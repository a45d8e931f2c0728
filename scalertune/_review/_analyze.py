"""analyze(): a search's result rebuilt from the study alone, the same after one worker, several
workers or a crash.

The ranking of the short trials, the candidates that reached the target, the finalists and
how their branches did at the phases of the horizon, the confirmations, the best AMP config
that held and was confirmed, float32 at its clip, and the answer on this device: the best
AMP config when it is faster than float32 beyond the noise, float32 otherwise.
"""

from __future__ import annotations

import dataclasses

import optuna
from optuna.trial import FrozenTrial, TrialState

from scalertune import _policy
from scalertune._judge._horizon import (
    fewer_steps,
    holds,
    phases_of,
    ruled_out,
    seed_spread,
)
from scalertune._judge._outcome import Outcome, outcomes_of, reference_of
from scalertune._judge._rank import candidates, confirmations_of, ranked
from scalertune._judge._settings import StudySettings
from scalertune._judge._stored import sound
from scalertune._review._findings import amp_wins
from scalertune._review._result import SearchResult
from scalertune._review._runs import real_runs
from scalertune._storage._names import (
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_ISLAND,
    ROLE_RECOMMENDED,
    ROLE_SURPLUS,
    STOPPED_ATTR,
    TIMES_ATTR,
)
from scalertune._storage._recovery import missing_of


def analyze(study: optuna.Study, *, storage: str = "") -> SearchResult:
    """Rebuild the result of a search from its study alone, without training anything.

    What ``scalertune report`` and the dashboard's notes show; any worker, or a later
    session, can ask a study for its answer this way.

    Args:
        study: The Optuna study a search wrote (``optuna.load_study(study_name=...,
            storage=...)``).
        storage: The storage URL to record in the result (its password hidden); ``""`` for
            none.

    Returns:
        The :class:`SearchResult`, as :func:`search` returned it (or as far as the study got).

    Raises:
        UsageError: The study's settings were written by a newer scalertune than this one.

    Example:
        >>> import optuna, scalertune
        >>> study = optuna.load_study(study_name="classifier:make_model",
        ...                           storage="sqlite:///scalertune.db")  # doctest: +SKIP
        >>> result = scalertune.analyze(study)  # doctest: +SKIP
        >>> result.config.describe()  # doctest: +SKIP
        'float16 scale=4096 growth=2 backoff=0.5 every 2000, no clip'
    """
    settings = StudySettings.of(study)
    seed = settings.seed
    # a run whose stored evidence is damaged is left out of everything below, and said
    trials, damaged = sound(study.get_trials(deepcopy=False))
    outcomes = outcomes_of(trials)
    ranking = ranked(outcomes)
    references = {
        s: ref
        for s in (seed, *_policy.CONFIRM_SEEDS)
        if (ref := reference_of(study, s)) is not None
    }
    times = references[seed].get("step_times") if seed in references else None
    spread = seed_spread([r.get("steps_to_target") for r in references.values()])
    pool = candidates(ranking, times, settings.clip_norm, settings.noise(spread))
    phases = phases_of(trials)
    ruled = ruled_out(trials)
    ordered = [c for c in pool if holds(c, phases, settings.windows, ruled)][: _policy.CONFIRM_TOP]
    result = SearchResult(
        study_name=study.study_name,
        storage=storage,
        settings=settings,
        references=references,
        ranking=ranking,
        candidates=ordered,
        confirmations=_confirmations(pool, outcomes, trials),
        recommended=None,
        pool=pool,
        phases=phases,
        ruled=ruled,
        spread=spread,
        islands=[o for o in ranking if o.role == ROLE_ISLAND],
        failed=sum(
            t.state == TrialState.FAIL
            and "error" in t.user_attrs
            and t.user_attrs.get("role") != ROLE_SURPLUS
            for t in trials
        ),
        lost=sum(
            t.state == TrialState.FAIL
            and "error" not in t.user_attrs
            and "missing" not in t.user_attrs
            for t in trials
        ),
        missing=missing_of(trials),
        damaged=damaged,
        steps_trained=_steps_trained(trials),
        reused=sum(o.reused for o in outcomes),
        stop_reason=study.user_attrs.get(STOPPED_ATTR),
        runs=real_runs(study.user_attrs),
        study=study,
    )
    return _answer(result, trials)


def _confirmations(
    ordered: list[Outcome], outcomes: list[Outcome], trials: list[FrozenTrial]
) -> dict[int, dict[int, Outcome]]:
    failed = [
        Outcome.from_trial(t)
        for t in trials
        if t.state == TrialState.FAIL
        and t.user_attrs.get("role") == ROLE_CONFIRM
        and "error" in t.user_attrs
    ]
    return {c.number: confirmations_of(c, [*outcomes, *failed]) for c in ordered}


def _answer(result: SearchResult, trials: list[FrozenTrial]) -> SearchResult:
    """The best AMP config (the first confirmed candidate, every one before it failed), float32
    at its clip, and the answer on this device."""
    ordered = result.candidates
    best = next(
        (
            c
            for c in ordered
            if result.confirmation_state(c) == "confirmed"
            and all(result.confirmation_state(b) == "failed" for b in ordered[: ordered.index(c)])
        ),
        None,
    )
    twins = [
        Outcome.from_trial(t)
        for t in trials
        if t.user_attrs.get("role") == ROLE_FLOAT32_CLIP
        and t.state in (TrialState.COMPLETE, TrialState.PRUNED)
    ]
    twin = (
        None
        if best is None
        else next(
            (
                o
                for o in twins
                if o.seed == best.seed and o.config.clip_norm == best.config.clip_norm
            ),
            None,
        )
    )
    result = dataclasses.replace(result, best_amp=best, float32_clip=twin)
    if best is not None and amp_wins(result, best):
        return dataclasses.replace(result, recommended=best)
    return dataclasses.replace(result, float32_choice=_float32_choice(result, twin))


def _float32_choice(result: SearchResult, twin: Outcome | None) -> Outcome | None:
    """float32 at the best AMP config's clip, when it reaches the target in fewer steps than
    the workload's own float32 beyond the seed spread, and holds for the horizon."""
    ref = result.reference
    if (
        twin is None
        or not twin.reached
        or twin.steps_to_target is None
        or not ref
        or not ref.get("steps_to_target")
    ):
        return None
    if not fewer_steps(twin.steps_to_target, ref["steps_to_target"], result.spread):
        return None
    return twin if result.holds(twin) else None


def _steps_trained(trials: list[FrozenTrial]) -> int:
    total = 0
    for trial in trials:
        attrs = trial.user_attrs
        if "duplicate_of" in attrs or attrs.get("role") == ROLE_RECOMMENDED:
            continue
        total += int(attrs.get("steps_run") or 0)
        times = trial.system_attrs.get(TIMES_ATTR)
        if times:
            total += int(times.get("steps", 0))
    return total
