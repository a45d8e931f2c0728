"""A study read incrementally (:class:`~scalertune._judge._view.StudyView`): a finished trial
never changes, so it is checked and read once, however many decisions the search makes;
only what is new, or still running, is read again. Each test counts the checks on a real
SQLite study that a real search wrote."""

import collections

import optuna
import pytest
from conftest import spec
from optuna.trial import TrialState

import scalertune
from scalertune._judge import _stored
from scalertune._judge._answer import judge
from scalertune._judge._judged import Judged
from scalertune._judge._reference import Reference
from scalertune._judge._view import StudyView
from scalertune._storage._names import ROLE_SEARCH
from scalertune._storage._trial_record import Job, Marks

STEPS = 40


@pytest.fixture
def checks(monkeypatch):
    """Trial number -> how often its evidence was checked while finished, (record, trial
    number) -> how often a finished trial's record was read, and the float32 references
    read, counted where every check and every read goes through."""
    counts = {"checked": collections.Counter(), "references": 0, "read": collections.Counter()}
    check_run, from_trial = _stored._check_run, Reference.from_trial.__func__
    for record in (Job, Marks, Judged):
        of_trial = record.of_trial.__func__

        def counting_of_trial(cls, trial, of_trial=of_trial):
            if isinstance(trial, optuna.trial.FrozenTrial) and trial.state.is_finished():
                counts["read"][cls.__name__, trial.number] += 1
            return of_trial(cls, trial)

        monkeypatch.setattr(record, "of_trial", classmethod(counting_of_trial))

    def counting_check(trial):
        if trial.state.is_finished():
            counts["checked"][trial.number] += 1
        return check_run(trial)

    def counting_read(cls, trial):
        counts["references"] += 1
        return from_trial(cls, trial)

    monkeypatch.setattr(_stored, "_check_run", counting_check)
    monkeypatch.setattr(Reference, "from_trial", classmethod(counting_read))
    return counts


def _search(storage, n_trials=4):
    scalertune.search(
        spec("healthy"),
        storage=storage,
        study_name="view",
        n_trials=n_trials,
        steps=STEPS,
        device="cpu",
    )
    return optuna.load_study(study_name="view", storage=storage)


def _one_more_run(study):
    """A search trial that finished after the first decision: a copy of one the search
    wrote, as its writers wrote it."""
    run = next(
        t
        for t in study.get_trials(states=(TrialState.COMPLETE, TrialState.PRUNED))
        if t.user_attrs.get("role") == ROLE_SEARCH
    )
    study.add_trial(
        optuna.trial.create_trial(
            state=run.state,
            value=run.value,
            params=run.params,
            distributions=run.distributions,
            intermediate_values=run.intermediate_values,
            user_attrs=run.user_attrs,
            system_attrs=run.system_attrs,
        )
    )
    return study.get_trials(deepcopy=False)[-1].number


def test_a_second_decision_checks_only_the_trial_that_finished_since(storage, checks):
    study = _search(storage)
    view = StudyView(study)
    checks["checked"].clear()
    checks["read"].clear()
    checks["references"] = 0
    first = judge(study, view=view)
    assert checks["checked"] == {t.number: 1 for t in study.trials}
    # each record read in the check, and only there: judging reads what the check kept
    assert set(checks["read"].values()) == {1}
    assert checks["references"] == len(first.references)  # read in the check, kept

    checks["checked"].clear()
    checks["read"].clear()
    checks["references"] = 0
    new = _one_more_run(study)
    second = judge(study, view=view)
    assert dict(checks["checked"]) == {new: 1}
    assert dict(checks["read"]) == {(r, new): 1 for r in ("Job", "Marks", "Judged")}
    assert checks["references"] == 0
    # and the view changes no judgement: a judge that reads everything afresh agrees
    assert second == judge(study)


def test_a_search_checks_each_finished_trial_once_and_its_result_once_more(storage, checks):
    """However many decisions the search makes (the stop rule before each sample, a twin,
    the best so far, each once-per-study job), it reads a finished trial once; reading the
    result (``analyze``) is the only other reader."""
    study = _search(storage, n_trials=5)
    finished = [t.number for t in study.trials if t.state.is_finished()]
    assert len(finished) > 6
    assert max(checks["checked"].values()) <= 2, checks["checked"]
    # and each of its records as often: no pass over the trials (the twin, the budget, the
    # float32 references) reads one again
    assert max(checks["read"].values()) <= 2, checks["read"]
