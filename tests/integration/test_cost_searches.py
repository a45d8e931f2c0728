"""What a whole search costs: runs stop at the target, and sampling stops once it stops finding
faster configs."""

import math

import optuna
import pytest
from conftest import spec

import scalertune


def test_curves_are_one_point_per_window_relative_to_the_target(storage):
    scalertune.search(spec("healthy"), storage=storage, n_trials=2, steps=40, device="cpu")
    study = optuna.load_study(study_name="workloads:healthy", storage=storage)
    (reference,) = [
        t for t in study.trials if t.user_attrs["role"] == "reference" and t.user_attrs["seed"] == 0
    ]
    assert sorted(reference.intermediate_values) == [9, 19, 29, 39]
    # the reference ends at its smoothed final loss: the target is 10% above it (log10)
    assert reference.intermediate_values[39] == pytest.approx(math.log10(1 / 1.1))
    for trial in study.trials:
        if trial.user_attrs["role"] in ("search", "baseline") and trial.intermediate_values:
            steps = sorted(trial.intermediate_values)
            assert all((s + 1) % 10 == 0 for s in steps[:-1])
            if trial.user_attrs.get("steps_to_target"):
                assert trial.intermediate_values[steps[-1]] <= 0.0


def test_a_time_budget_stops_sampling_and_says_why(storage):
    result = scalertune.search(
        spec("healthy"), storage=storage, n_trials=50, steps=40, device="cpu", timeout=0.01
    )
    assert result.stop_reason == "the time budget (timeout) is spent"
    assert sum(o.role == "search" for o in result.ranking) <= 2
    assert result.best_amp is not None or result.candidates == []
