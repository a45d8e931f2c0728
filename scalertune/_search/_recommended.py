"""The recommended trial: the answer, where Optuna and optuna-dashboard look for it.

One more trial, role ``recommended``, added once every run it rests on has finished: its
config is the answer's, its curve and judged figures are those of the run it repeats (the
recommended AMP run, float32 at the best AMP config's clip, or the float32 reference), and its
value is that run's time to target as the summary prints it. ``scalertune dashboard`` shows it
as the study's Best Trial (optuna-dashboard's own choice, the least value, may be a faster run
that did not hold or was not confirmed).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from scalertune._errors import MissingEvidence
from scalertune._judge._answer import judge
from scalertune._judge._judged import repeated
from scalertune._judge._view import StudyView
from scalertune._review._verdict import verdict
from scalertune._search._setup import Setup
from scalertune._storage._names import (
    CONSTRAINT_ATTR,
    CONSTRAINTS_ATTR,
    JUDGED_ATTR,
    ROLE_RECOMMENDED,
    ROLE_REFERENCE,
)
from scalertune._storage._trial_record import Job, Recommendation, role_of
from scalertune._text import readable


def add_recommended(view: StudyView, setup: Setup) -> None:
    study = view.study
    result = judge(study, view=view)
    run = result.recommended or result.float32_choice
    if run is not None:
        repeats = view.trials()[run.number]
        value, source = run.time_to_target, Recommendation(recommends=run.number)
    else:
        ref = result.reference
        if ref is None:  # every search runs its reference before it recommends
            raise MissingEvidence(f"the study holds no float32 reference of seed {setup.seed}")
        repeats = view.trials()[ref.trial]
        value = result.reference_time_to_target
        source = Recommendation(recommends="float32", reference_trial=ref.trial)
    job = Job(ROLE_RECOMMENDED, seed=setup.seed, config=result.config)
    shown, judged = _shown(view, repeats, readable(value))
    # the answer's speed against float32: none of its own where the answer is float32
    speedup = result.speedup if result.recommended is not None else None
    trial = optuna.trial.create_trial(
        state=TrialState.COMPLETE,
        value=float(readable(value)),
        params=repeats.params if run is not None else {"dtype": "float32"},
        distributions=(
            repeats.distributions
            if run is not None
            else {"dtype": setup.settings.dtype_distribution}
        ),
        intermediate_values=dict(repeats.intermediate_values),
        user_attrs={
            **shown,
            **job.attrs(),
            **dataclasses.replace(
                source,
                verdict=verdict(result),
                speedup_vs_float32=None if speedup is None else round(speedup.point, 3),
            ).attrs(),
        },
        system_attrs={CONSTRAINT_ATTR: 0.0, CONSTRAINTS_ATTR: [0.0], **judged},
    )
    study.add_trial(trial)


def _shown(
    view: StudyView, repeats: FrozenTrial, time_to_target_s: float
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the recommended trial shows of the run it repeats, read from that run's records,
    never copied key by key: a run's judged figures (``time_to_target_s`` its own) and what
    the search noted of it but who ran it; the float32 reference's figures. Then the
    system attributes of its judged record (``{}`` for the reference, which has none)."""
    if role_of(repeats) == ROLE_REFERENCE:
        return view.reference(repeats).repeated(time_to_target_s), {JUDGED_ATTR: {}}
    records = view.records(repeats)
    user, system = repeated(records.judged, time_to_target_s)
    return {**user, **dataclasses.replace(records.marks, worker=None).attrs()}, system


def recommended_stored(view: StudyView) -> bool:
    config = judge(view.study, view=view).config
    return any(
        role_of(t) == ROLE_RECOMMENDED
        and (job := Job.sound(t)) is not None
        and job.config == config
        for t in view.trials()
    )
