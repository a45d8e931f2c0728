"""A running trial's curve, written to real storage from the background thread: every point
arrives, in one transaction per flush on an RDB storage, while the trial still runs."""

import time
import warnings

import optuna
import pytest
from sqlalchemy import event

from scalertune._amp._config import AmpConfig
from scalertune._judge._target import Target
from scalertune._run._record import RunRecord
from scalertune._search import _policy as _search_policy
from scalertune._search._reports import Reports
from scalertune._storage._optuna import write_points

TARGET = Target(loss=1.0, reference_final=0.9, reference_start=2.0)


def _commits(storage: optuna.storages.RDBStorage) -> list[int]:
    count = [0]
    event.listen(storage.engine, "commit", lambda _conn: count.__setitem__(0, count[0] + 1))
    return count


def test_many_points_are_one_transaction_on_sqlite_and_read_back_everywhere(storage):
    rdb = optuna.storages.RDBStorage(storage)
    study = optuna.create_study(storage=rdb, study_name="points")
    trial = study.ask()
    commits = _commits(rdb)
    points = [(0.1 * i, 10 * i + 9) for i in range(20)]
    write_points(trial, points)
    assert commits[0] == 1
    fresh = optuna.load_study(study_name="points", storage=storage)
    (running,) = fresh.trials
    assert running.state == optuna.trial.TrialState.RUNNING
    assert running.intermediate_values == {step: value for value, step in points}
    write_points(trial, [(7.0, 19), (8.0, 1000)])  # a step written before is overwritten
    values = optuna.load_study(study_name="points", storage=storage).trials[0].intermediate_values
    assert values[19] == 7.0 and values[1000] == 8.0 and len(values) == 21
    # the trial object knows them too, as after trial.report: a repeat is ignored
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trial.report(5.0, 9)
    assert any("already reported" in str(w.message) for w in caught)
    study.tell(trial, 1.0)
    assert study.trials[0].intermediate_values[9] == 0.0


def test_other_storages_get_the_points_through_trial_report():
    study = optuna.create_study()
    trial = study.ask()
    write_points(trial, [(1.5, 9), (float("nan"), 19)])
    values = study.trials[0].intermediate_values
    assert values[9] == 1.5 and values[19] != values[19]


def test_the_writer_flushes_while_the_trial_runs_and_everything_at_close(storage, monkeypatch):
    monkeypatch.setattr(_search_policy, "CURVE_FLUSH_S", 0.05)
    study = optuna.create_study(storage=storage, study_name="live")
    trial = study.ask()
    record = RunRecord(config=AmpConfig(dtype="float32"), seed=0, steps=40)
    reports = Reports(trial, TARGET)
    try:
        record.losses.extend([2.0] * 20)
        reports.window(record, 0)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            seen = optuna.load_study(study_name="live", storage=storage).trials[0]
            if seen.intermediate_values:
                break
            time.sleep(0.02)
        assert sorted(seen.intermediate_values) == [9, 19]  # before the run ends
        record.losses.extend([0.5] * 20)
        reports.window(record, 20)
    finally:
        reports.close()
    values = optuna.load_study(study_name="live", storage=storage).trials[0].intermediate_values
    assert sorted(values) == [9, 19, 29, 39]
    assert values[39] < 0.0 < values[9]  # below the target at the end, above it at first


def test_a_write_that_fails_is_raised_at_close(storage):
    study = optuna.create_study(storage=storage, study_name="failing")
    trial = study.ask()
    study.tell(trial, 1.0)  # a finished trial takes no more points
    record = RunRecord(config=AmpConfig(dtype="float32"), seed=0, steps=10)
    record.losses.extend([2.0] * 10)
    reports = Reports(trial, TARGET)
    reports.window(record, 0)
    with pytest.raises(RuntimeError, match="finished"):
        reports.close()
