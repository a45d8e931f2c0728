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


def test_the_evidence_says_the_steps_the_answers_own_runs_trained(storage):
    """On a GPT whose loss still falls, the best AMP config's runs reach the target near
    step 30 of 100: they train on to where float32 settled, and ``covers`` states the
    steps they trained (every one of them), not the horizon's, in the verdict too."""
    result = scalertune.search(
        spec("make_noisy", "nanogpt.py"),
        storage=storage,
        n_trials=1,
        steps=100,
        space="bfloat16",
        device="cpu",
    )
    best = result.best_amp
    confirmed = result.confirmations[best.number]
    runs = [best, *(confirmed[seed] for seed in sorted(confirmed))]
    # each run against its own seed's float32, where that settled
    settled = [result.references[o.seed].target.settled_step for o in runs]
    assert len(runs) == 3
    assert all(o.steps_to_target < s - 20 for o, s in zip(runs, settled))
    trained = [o.figures.steps_run for o in runs]
    assert all(s <= n <= 100 for n, s in zip(trained, settled))
    evidence = result.to_dict()["evidence"]
    said = evidence["covers"]
    if min(trained) < 100:
        assert said.startswith(f"steps 0-{min(trained)} of the 100-step horizon: {best.label}'s ")
        assert f"stopped at steps {', '.join(map(str, trained))} on seeds 0, 1, 2" in said
    else:
        assert said == "steps 0-100 of the horizon"
    assert evidence["verdict"].endswith(f"Evidence covers {said}")
