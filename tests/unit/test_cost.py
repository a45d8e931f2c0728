"""What a search costs: runs stop once their outcome is known, the study once more trials will
not change the answer, and nothing trains twice."""

import math

import torch
import workloads

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._judge._stopping import Best, StopRule, study_stop_reason
from scalertune._judge._target import Target
from scalertune._run._loop import run_config

CPU = torch.device("cpu")


def _target(seed=0, steps=80):
    return Target.from_reference(run_config(workloads.healthy, AmpConfig(dtype="float32"),
                                            steps=steps, seed=seed, device=CPU).losses)


def test_a_run_stopped_at_the_target_has_the_steps_to_target_of_the_full_run():
    target = _target()
    config = AmpConfig(dtype="bfloat16")
    early = run_config(workloads.healthy, config, steps=80, seed=0, device=CPU,
                       stop=StopRule(target))
    full = run_config(workloads.healthy, config, steps=80, seed=0, device=CPU,
                      stop=StopRule(target, at_target=False))
    assert early.stopped == "reached" and full.stopped is None
    assert early.reached_at == full.reached_at == target.steps_to_target(full.losses)
    assert early.steps_run < full.steps_run == 80
    assert early.losses == full.losses[:early.steps_run]


def test_a_run_that_cannot_beat_the_best_is_pruned_as_slower():
    target = _target()
    fast = Best(time_high=1e-9, label="trial #3")
    record = run_config(workloads.healthy, AmpConfig(dtype="bfloat16"), steps=80, seed=0,
                        device=CPU, stop=StopRule(target, step_time=(1e-3, 2e-3), best=fast))
    assert record.prune_kind == "slower" and record.steps_run == 10
    assert "trial #3" in record.prune_reason
    same_dtype = Best(time_high=math.inf, label="trial #4", steps={"float16": (1, "trial #4")})
    record = run_config(workloads.healthy, AmpConfig(init_scale=1.0), steps=80, seed=0,
                        device=CPU, stop=StopRule(target, step_time=(1e-3, 2e-3),
                                                  best=same_dtype))
    assert record.prune_kind == "slower" and "float16 too" in record.prune_reason


def test_the_study_stops_after_a_patience_of_trials_without_progress():
    progress = [(10.0 - i, False) for i in range(_policy.STUDY_MIN_TRIALS)]
    assert study_stop_reason(progress) is None
    flat = progress + [(5.0, False)] * _policy.STUDY_PATIENCE
    assert "found no faster time" in study_stop_reason(flat)
    # reused duplicates count neither way, but many in a row mean the space is spent
    assert study_stop_reason(progress + [(None, True)] * 3) is None
    spent = progress + [(None, True)] * _policy.MAX_CONSECUTIVE_DUPLICATES
    assert "nothing new" in study_stop_reason(spent)


def test_a_run_that_ends_without_reaching_the_target_is_not_called_slower():
    target = _target()
    hopeless = Best(time_high=1e-9, label="trial #3")
    record = run_config(workloads.underflow, AmpConfig(init_scale=1.0), steps=10, seed=0,
                        device=CPU, stop=StopRule(target, step_time=(1e-3, 2e-3), best=hopeless))
    assert record.steps_run == 10 and not record.pruned
