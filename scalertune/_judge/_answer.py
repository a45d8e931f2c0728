"""The judgement of a whole study: what its runs show, and the answer they support.

:func:`judge` rebuilds :class:`~scalertune._judge._findings.Findings` from the study alone, the
same after one worker, several workers or a crash: the ranking of the short trials, the
candidates that reached the target, the finalists and how their runs did at the phases of the
horizon, the confirmations, and the rules that choose:

- the **best AMP config**: the first candidate confirmed on every seed (and, over a long
  horizon, holding there), every one before it having failed;
- **float32 at its clip**: float32 clipped as the best AMP config is, the answer in place of
  the workload's own float32 when it reaches the target in fewer steps beyond the seed spread
  and holds for the horizon;
- the **answer on this device**: the best AMP config when it is faster than float32 beyond
  the noise (:func:`~scalertune._judge._findings.amp_wins`), float32 otherwise.

The search asks it what to run next; the review shows what it decided.
"""

from __future__ import annotations

import dataclasses

import optuna
from optuna.trial import FrozenTrial, TrialState

from scalertune import _policy
from scalertune._errors import DamagedEvidence
from scalertune._judge._findings import Findings, amp_wins
from scalertune._judge._horizon import (
    fewer_steps,
    holds,
    phases_of,
    ruled_out,
    seed_spread,
)
from scalertune._judge._outcome import Outcome
from scalertune._judge._rank import candidates, confirmations_of, ranked
from scalertune._judge._settings import StudySettings
from scalertune._judge._view import StudyView
from scalertune._storage._names import (
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_ISLAND,
    ROLE_RECOMMENDED,
    ROLE_REFERENCE,
    ROLE_SURPLUS,
    STOPPED_ATTR,
)
from scalertune._storage._recovery import missing_of
from scalertune._storage._trial_record import role_of


def judge(study: optuna.Study, *, storage: str = "", view: StudyView | None = None) -> Findings:
    """What the study's runs show, judged from the study alone (no training runs): the
    ranking, the candidates, the evidence over the horizon, the confirmations, the best AMP
    config, float32 at its clip, and the answer on this device.

    Args:
        study: The study.
        storage: Its storage's URL, as the findings name it (redacted).
        view: The search's view of ``study`` (:class:`~scalertune._judge._view.StudyView`),
            which checks and reads each finished trial once over all the questions it asks;
            ``None``: a view of this judgement's own.

    Returns:
        The findings.

    Example:
        >>> judge(study).recommended.config.describe()  # doctest: +SKIP
        'float16 scale=4096 growth=2 backoff=0.5 every 2000, no clip'
    """
    view = StudyView(study) if view is None else view
    settings = StudySettings.of(study)
    seed = settings.seed
    # a run whose stored evidence is damaged is left out of everything below, and said
    every = view.trials()
    trials, damaged = view.sound(every)
    outcomes = view.outcomes(trials)
    ranking = ranked(outcomes)
    references = {
        s: ref
        for s in (seed, *_policy.confirm_seeds(seed))
        if (ref := view.reference_of(s, every)) is not None
    }
    times = references[seed].step_times if seed in references else None
    spread = seed_spread([r.steps_to_target for r in references.values()])
    pool = candidates(ranking, times, settings.clip_norm, settings.noise(spread))
    phases = phases_of(trials, view.records)
    ruled = ruled_out(trials, view.records)
    ordered = [c for c in pool if holds(c, phases, settings.windows, ruled)][: _policy.CONFIRM_TOP]
    result = Findings(
        study_name=study.study_name,
        storage=storage,
        settings=settings,
        references=references,
        ranking=ranking,
        candidates=ordered,
        confirmations=_confirmations(pool, outcomes, trials, view),
        recommended=None,
        pool=pool,
        phases=phases,
        ruled=ruled,
        spread=spread,
        islands=[o for o in ranking if o.role == ROLE_ISLAND],
        failed=sum(
            t.state == TrialState.FAIL
            and view.records(t).marks.error is not None
            and role_of(t) != ROLE_SURPLUS
            for t in trials
        ),
        lost=sum(
            t.state == TrialState.FAIL
            and view.records(t).marks.error is None
            and view.records(t).marks.missing is None
            for t in trials
        ),
        missing=missing_of(trials),
        damaged=damaged,
        steps_trained=_steps_trained(trials, view),
        reused=sum(o.reused for o in outcomes),
        stop_reason=study.user_attrs.get(STOPPED_ATTR),
        study=study,
    )
    return _answer(result, trials, view)


def _confirmations(
    ordered: list[Outcome], outcomes: list[Outcome], trials: list[FrozenTrial], view: StudyView
) -> dict[int, dict[int, Outcome]]:
    failed = [
        view.outcome(t)
        for t in trials
        if t.state == TrialState.FAIL
        and role_of(t) == ROLE_CONFIRM
        and view.records(t).marks.error is not None
    ]
    found = confirmations_of([*outcomes, *failed])
    return {c.number: found.get(c.number, {}) for c in ordered}


def _answer(result: Findings, trials: list[FrozenTrial], view: StudyView) -> Findings:
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
        view.outcome(t)
        for t in trials
        if role_of(t) == ROLE_FLOAT32_CLIP and t.state in (TrialState.COMPLETE, TrialState.PRUNED)
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


def _float32_choice(result: Findings, twin: Outcome | None) -> Outcome | None:
    """float32 at the best AMP config's clip, when it reaches the target in fewer steps than
    the workload's own float32 beyond the seed spread, and holds for the horizon."""
    ref = result.reference
    if (
        twin is None
        or not twin.reached
        or twin.steps_to_target is None
        or not ref
        or not ref.steps_to_target
    ):
        return None
    if not fewer_steps(twin.steps_to_target, ref.steps_to_target, result.spread):
        return None
    return twin if result.holds(twin) else None


def _steps_trained(trials: list[FrozenTrial], view: StudyView) -> int:
    total = 0
    for trial in trials:
        role, records = role_of(trial), view.records(trial)
        if records.marks.duplicate_of is not None or role == ROLE_RECOMMENDED:
            continue
        total += int(records.judged.figures.steps_run or 0)
        if role == ROLE_REFERENCE and trial.state == TrialState.COMPLETE:
            try:  # and the step timing it ran
                times = view.reference(trial).step_times
            except DamagedEvidence:
                continue
            total += 0 if times is None else times.steps
    return total
