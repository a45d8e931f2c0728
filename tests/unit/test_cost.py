"""What a search costs: runs stop once their outcome is known, the study once more trials will
not change the answer, and nothing trains twice."""

import dataclasses
import functools
import math

import nanogpt
import torch
import workloads
from outcomes import sampled

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._judge import _policy as _judge_policy
from scalertune._judge._settings import Noise
from scalertune._judge._stopping import Best, Floor, StopRule, study_stop_reason
from scalertune._judge._target import Target, smoothed
from scalertune._run._loop import run_config
from scalertune._run._record import RunRecord
from scalertune._run._step_times import StepTimes

CPU = torch.device("cpu")


def _target(seed=0, steps=80):
    return Target.from_reference(
        run_config(
            workloads.healthy, AmpConfig(dtype="float32"), steps=steps, seed=seed, device=CPU
        ).losses
    )


def test_a_run_stopped_at_the_target_has_the_steps_to_target_of_the_full_run():
    target = _target()
    config = AmpConfig(dtype="bfloat16")
    early = run_config(
        workloads.healthy, config, steps=80, seed=0, device=CPU, stop=StopRule(target)
    )
    full = run_config(
        workloads.healthy,
        config,
        steps=80,
        seed=0,
        device=CPU,
        stop=StopRule(target, at_target=False),
    )
    assert early.stopped == "reached" and full.stopped is None
    assert early.reached_at == full.reached_at == target.steps_to_target(full.losses)
    assert early.steps_run < full.steps_run == 80
    assert early.losses == full.losses[: early.steps_run]


@functools.cache
def _noisy_gpt_float32():
    """float32's per-step losses over 200 steps of the GPT whose loss still falls
    (``nanogpt.make_noisy``), and its target."""
    reference = run_config(
        nanogpt.make_noisy, AmpConfig(dtype="float32"), steps=200, seed=0, device=CPU
    )
    return reference.losses, Target.from_reference(reference.losses)


def test_a_target_reached_while_float32_still_falls_trains_on_until_float32_settles():
    """On a GPT whose loss still falls (nanoGPT on a noisy corpus), bfloat16 reaches the
    target near step 50 of 200, float32's loss still 5% and more above its end there: with
    ``run_on`` the run trains on to where float32 settled, keeps its steps to the target, and
    is still at the target when it stops."""
    _, target = _noisy_gpt_float32()
    record = run_config(
        nanogpt.make_noisy,
        AmpConfig(dtype="bfloat16"),
        steps=200,
        seed=0,
        device=CPU,
        stop=StopRule(target, run_on=True),
    )
    reached, settled = record.reached_at, target.settled_step
    assert reached is not None and reached < 100 and settled is not None
    assert target.reference_curve[reached - 1] > 1.05 * target.reference_final
    assert record.stopped == "reached" and not record.pruned
    assert settled <= record.steps_run < settled + _policy.READBACK_INTERVAL
    assert reached == target.steps_to_target(record.losses)
    assert smoothed(record.losses)[-1] <= target.loss


def test_a_run_that_trained_on_and_is_past_the_tolerance_of_float32_is_pruned_as_behind():
    """A run that follows float32 to the target and then stalls (as bfloat16 does once float32
    learns finer than its 8 bits) is more than 10% above float32's loss once float32
    settles: pruned as behind, with both steps named. Stopped at the target, it would have
    passed. Following float32 to the end, it holds."""
    losses, target = _noisy_gpt_float32()
    reached = target.steps_to_target(losses)
    level = smoothed(losses)[reached - 1] * 1.1
    stalled = list(losses[:reached]) + [level] * (200 - reached)
    for rule in (StopRule(target, run_on=True), StopRule(target)):
        record = RunRecord(config=AmpConfig(dtype="bfloat16"), seed=0, steps=200)
        for end in range(10, 201, 10):
            record.losses = stalled[:end]
            if rule(record):
                break
        if rule.run_on:
            assert record.prune_kind == record.stopped == "behind"
            assert record.steps_run == math.ceil(target.settled_step / 10) * 10
            assert f"reaching the target at step {reached}" in record.prune_reason
            assert target.ratio_at(record.losses)[0] > 1.1
        else:
            assert record.stopped == "reached" and record.steps_run < reached + 10
    followed = RunRecord(config=AmpConfig(dtype="bfloat16"), seed=0, steps=200)
    rule = StopRule(target, run_on=True)
    for end in range(10, 201, 10):
        followed.losses = list(losses[:end])
        if rule(followed):
            break
    assert followed.stopped == "reached"
    assert followed.steps_run == math.ceil(target.settled_step / 10) * 10


def test_a_run_that_cannot_beat_the_best_is_pruned_as_slower():
    target = _target()
    fast = Best(time_high=1e-9, label="trial #3")
    record = run_config(
        workloads.healthy,
        AmpConfig(dtype="bfloat16"),
        steps=80,
        seed=0,
        device=CPU,
        stop=StopRule(target, step_time=(1e-3, 2e-3), best=fast),
    )
    assert record.prune_kind == "slower" and record.steps_run == 10
    assert "trial #3" in record.prune_reason
    same_dtype = Best(time_high=math.inf, label="trial #4", steps={"float16": (1, "trial #4")})
    record = run_config(
        workloads.healthy,
        AmpConfig(init_scale=1.0),
        steps=80,
        seed=0,
        device=CPU,
        stop=StopRule(target, step_time=(1e-3, 2e-3), best=same_dtype),
    )
    assert record.prune_kind == "slower" and "float16 too" in record.prune_reason


def test_a_run_pruned_as_slower_far_from_float32s_loss_says_how_far():
    """A run stalled far above float32's loss (torchao's tensorwise under an outlier) is
    pruned as slower, and its reason also says where its loss stands against float32's, as
    the summary's loss column does: not merely later. A run that follows float32 a step or
    two behind is pruned with no such figure."""
    losses, target = _noisy_gpt_float32()
    rule = StopRule(target, step_time=(1e-3, 2e-3), best=Best(time_high=1e-9, label="trial #3"))
    stalled = RunRecord(config=AmpConfig(dtype="bfloat16"), seed=0, steps=200)
    stalled.losses = [losses[0] * 4] * 60
    assert rule(stalled) and stalled.prune_kind == "slower"
    ratio, at = target.ratio_at(stalled.losses)
    assert ratio > 2 and f"(its smoothed loss {ratio:.3g}x float32's at step {at})" in (
        stalled.prune_reason
    )
    behind = RunRecord(config=AmpConfig(dtype="bfloat16"), seed=0, steps=200)
    behind.losses = list(losses[:30])  # float32's own: not at the target yet
    assert rule(behind) and behind.prune_kind == "slower"
    assert "smoothed loss" not in behind.prune_reason


def _bfloat16_run(stop):
    """The healthy workload in bfloat16 for at most 80 steps under ``stop``."""
    return run_config(
        workloads.healthy, AmpConfig(dtype="bfloat16"), steps=80, seed=0, device=CPU, stop=stop
    )


def test_a_run_that_float32_at_its_clip_says_cannot_win_is_pruned_at_its_first_read_back():
    """float32 clipped as the run is reached the target at step 78: with the tie's margin, no
    run of that clip is expected there before step 70, too late to beat the best's 0.05 s."""
    target = _target()
    rule = dict(step_time=(1e-3, 2e-3), best=Best(time_high=0.05, label="trial #3"))
    floored = _bfloat16_run(StopRule(target, floor=Floor(steps=70, reached=78), **rule))
    assert floored.prune_kind == "slower" and floored.steps_run == _policy.READBACK_INTERVAL
    assert "not before step 70 (float32 at its clip reached it at step 78" in floored.prune_reason
    # without the floor the same run trains until its own steps rule it out
    plain = _bfloat16_run(StopRule(target, **rule))
    assert plain.steps_run > 40 and "float32 at its clip" not in (plain.prune_reason or "")
    # a floor before the best's time prunes nothing early
    early = _bfloat16_run(StopRule(target, floor=Floor(steps=20, reached=28), **rule))
    assert early.steps_run == plain.steps_run


def test_a_floor_beyond_its_own_dtypes_best_by_more_than_a_tie_prunes_at_once():
    target = _target()
    own = Best(time_high=math.inf, label="trial #4", steps={"bfloat16": (30, "trial #4")}, margin=5)
    rule = dict(step_time=(1e-3, 2e-3), best=own)
    record = _bfloat16_run(StopRule(target, floor=Floor(steps=36, reached=40), **rule))
    assert record.prune_kind == "slower" and record.steps_run == _policy.READBACK_INTERVAL
    assert "not before step 36" in record.prune_reason
    assert "bfloat16 too" in record.prune_reason
    # within the tie's margin of its dtype's best it runs on
    record = _bfloat16_run(StopRule(target, floor=Floor(steps=35, reached=40), **rule))
    assert record.steps_run > _policy.READBACK_INTERVAL


#: float16 steps 1.4-1.6x float32's, bfloat16 1.15-1.4x: bfloat16 is surely faster per step.
TIMES = StepTimes(
    {
        "float32": [1e-3] * 6,
        "float16": [1.40e-3, 1.45e-3, 1.50e-3, 1.53e-3, 1.58e-3, 1.61e-3],
        "bfloat16": [1.15e-3, 1.22e-3, 1.33e-3, 1.36e-3, 1.38e-3, 1.39e-3],
    }
)
#: float32's seed spread of steps to the target: 10%.
NOISE = Noise(0.10)


def _sampled(number, steps, dtype="bfloat16", *, state="complete", reused=False, clip=None):
    """A sampled run as the study stores it: ``steps`` to the target (``None``: never)."""
    step_time = TIMES.median(dtype)
    return sampled(
        number,
        AmpConfig(dtype=dtype, clip_norm=clip),
        state=state,
        duplicate_of=3 if reused else None,
        steps_to_target=steps,
        time_to_target_s=None if steps is None else steps * step_time,
    )


def test_the_study_stops_after_a_patience_of_trials_without_progress():
    # each run 20% fewer steps than the last, beyond the 10% seed spread: progress every time
    progress = [_sampled(3 + i, int(200 * 0.8**i)) for i in range(_policy.STUDY_MIN_TRIALS)]
    assert study_stop_reason(progress, TIMES, NOISE) is None
    never = [_sampled(20 + i, None, state="pruned") for i in range(_judge_policy.STUDY_PATIENCE)]
    assert "found no faster time" in study_stop_reason(progress + never, TIMES, NOISE)
    # where none reached the target, there is no faster time to speak of (a Lightning
    # example's summary said so of four runs that all missed it)
    none = [
        _sampled(50 + i, None)
        for i in range(max(_policy.STUDY_MIN_TRIALS, _judge_policy.STUDY_PATIENCE))
    ]
    said = study_stop_reason(none, TIMES, NOISE)
    assert said.startswith(f"none of the last {len(none)} sampled trials reached the target")
    # reused duplicates count neither way, but many in a row mean the space is spent
    reused = [_sampled(30 + i, 100, reused=True) for i in range(3)]
    assert study_stop_reason(progress + reused, TIMES, NOISE) is None
    spent = [
        _sampled(40 + i, 100, reused=True) for i in range(_judge_policy.MAX_CONSECUTIVE_DUPLICATES)
    ]
    assert "nothing new" in study_stop_reason(progress + spent, TIMES, NOISE)
    # a float8 config pruned on the first batch's evidence is no sign that sampling is spent
    spoiled = [
        dataclasses.replace(_sampled(60 + i, None, state="pruned"), prune_kind="float8")
        for i in range(max(_policy.STUDY_MIN_TRIALS, _judge_policy.STUDY_PATIENCE))
    ]
    assert study_stop_reason(spoiled, TIMES, NOISE) is None
    assert study_stop_reason(progress + spoiled, TIMES, NOISE) is None


def test_a_tie_within_the_noise_is_no_progress_however_much_faster_its_estimate():
    # 8% fewer steps of the same dtype is within the 10% seed spread: a tie, not progress
    ties = [
        _sampled(3, 100),
        _sampled(4, None, state="pruned"),
        *(_sampled(5 + i, 92 - i) for i in range(_policy.STUDY_MIN_TRIALS - 2)),
    ]
    assert "beyond the noise" in study_stop_reason(ties, TIMES, NOISE)
    # 20% fewer is beyond it: progress, and sampling goes on
    assert study_stop_reason([*ties[:-1], _sampled(9, 80)], TIMES, NOISE) is None


def test_sampling_stops_early_when_trials_in_a_row_reach_the_target_no_faster():
    """As on the shipped classifier: every config reaches the target at float32's own step,
    whatever its clip, and float16 is slower per step on this CPU."""
    runs = [
        _sampled(3, 147, clip=48.9),
        _sampled(4, 147, "float16"),
        _sampled(5, 147),
        _sampled(6, 150, "float16"),
    ]
    tied = _policy.STUDY_TIED_TRIALS
    assert tied < _policy.STUDY_MIN_TRIALS
    found = study_stop_reason(runs[:tied], TIMES, NOISE)
    assert f"the last {tied} sampled trials all reached the target" in found
    assert "none faster than the best beyond the noise" in found
    assert study_stop_reason(runs[: tied - 1], TIMES, NOISE) is None
    # not over a long horizon, where the trials only find the families the phases judge
    assert study_stop_reason(runs, TIMES, NOISE, tied_trials=None) is None
    # a run faster beyond the noise starts the streak again
    faster = [*runs[: tied - 1], _sampled(7, 120)]
    assert study_stop_reason(faster, TIMES, NOISE) is None


def test_a_run_that_misses_the_target_keeps_sampling_going():
    """As on the shipped codepoints example: float16 runs that never reach the target show
    that the knobs matter, and the streak starts again."""
    runs = [
        _sampled(3, 105, clip=48.9),
        _sampled(4, 105),
        _sampled(5, None, "float16"),
        _sampled(6, 106),
        _sampled(7, 104, clip=0.453),
    ]
    assert study_stop_reason(runs, TIMES, NOISE) is None
    # the float16 run that misses was the first: the three after it reached, no faster
    assert study_stop_reason([runs[0], runs[2], runs[1], runs[3], runs[4]], TIMES, NOISE)


def test_a_run_that_ends_without_reaching_the_target_is_not_called_slower():
    target = _target()
    hopeless = Best(time_high=1e-9, label="trial #3")
    record = run_config(
        workloads.underflow,
        AmpConfig(init_scale=1.0),
        steps=10,
        seed=0,
        device=CPU,
        stop=StopRule(target, step_time=(1e-3, 2e-3), best=hopeless),
    )
    assert record.steps_run == 10 and not record.pruned
