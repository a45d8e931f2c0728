"""The recommendation and its verdict: interleaved timing, the user's clipping, a reference that
learns, skipped steps as GradScaler counts them, no config trained twice."""

import random
import subprocess
import sys

import optuna
import pytest
import torch
import workloads
from conftest import spec
from outcomes import sampled

import scalertune
from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._judge._rank import Noise, all_tied, candidates, faster_pairs, surely_faster
from scalertune._judge._speedup import Speedup
from scalertune._judge._target import Target
from scalertune._run._loop import run_config
from scalertune._run._record import skipped_steps
from scalertune._run._step_times import StepTimes, spread
from scalertune._run._timing import time_dtypes
from scalertune._workload._factory import build_workload

CPU = torch.device("cpu")


def test_interleaved_timing_measures_every_dtype_in_paired_rounds():
    workload = build_workload(workloads.healthy, seed=0, device=CPU)
    times = time_dtypes(workload, ["bfloat16", "float16"], device=CPU, clip_norm=None)
    assert set(times.rounds) == {"float32", "bfloat16", "float16"}
    for dtype in times.rounds:
        assert len(times.rounds[dtype]) == _policy.TIMING_ROUNDS
        assert all(t > 0 for t in times.rounds[dtype])
    assert times.steps == 3 * (_policy.TIMING_WARMUP_STEPS + _policy.TIMING_ROUNDS * 10)
    low, high = times.bounds("bfloat16")
    assert low <= times.median("bfloat16") <= high


def test_one_window_hit_by_load_does_not_widen_the_spread():
    ratios = [1.3, 1.35, 1.28, 1.31, 30.0, 1.33]
    assert spread(ratios) == (1.3, 1.35)
    assert spread([1.0, 2.0]) == (1.0, 2.0)


@pytest.mark.parametrize(
    "steps, times, words",
    [
        ([1.9, 2.0, 2.1], [1.2, 1.3, 1.25, 1.3, 1.28, 1.27], "faster than float32"),
        ([1.0, 1.0, 1.0], [1.5, 1.6, 1.55, 1.5, 1.58, 1.52], "slower than float32"),
        (
            [1.9, 2.0, 2.1],
            [1.7, 2.3, 1.9, 2.0, 2.2, 1.8],
            "as fast as float32 to the target on gpu within measurement noise",
        ),
    ],
)
def test_the_verdict_states_a_direction_only_outside_the_noise(steps, times, words):
    speedup = Speedup.of(steps, times)
    assert words in speedup.verdict("gpu")
    assert speedup.low <= speedup.point <= speedup.high
    if "within" in words:
        assert speedup.low <= 1 <= speedup.high


def test_amp_slower_on_a_cpu_says_why_and_off_a_cpu_says_nothing_more():
    slower = Speedup.of([1.0, 1.0], [1.5, 1.6, 1.7, 1.5, 1.6, 1.7])
    assert slower.verdict("cpu (x86_64, 2 threads)").endswith(
        "float32's time). CPUs without native half-precision matmul run AMP steps slower "
        "than float32; to choose for GPU training, run the search on that GPU"
    )
    assert slower.verdict("cuda:0 (NVIDIA A100)").endswith("float32's time)")
    assert slower.verdict("cpu (x86_64, 2 threads)", note=False).endswith("float32's time)")
    assert Speedup.of([1.0], [0.5]).cpu_note("cpu (x86_64, 2 threads)") == ""


def _outcome(number, dtype, steps, skipped=0, min_scale=None, clip=None):
    return sampled(
        number,
        AmpConfig(dtype=dtype, clip_norm=clip, init_scale=2.0**number),
        steps_to_target=steps,
        time_to_target_s=steps * (1.0 if dtype == "bfloat16" else 1.02),
        skipped_steps=skipped,
        min_scale=min_scale,
    )


def test_skip_counts_within_the_replays_tolerance_are_the_same_and_simplicity_decides():
    """PyTorch's defaults skipping two steps more than a tuned scaler, at the same steps to
    the target, are as stable: the defaults win; ten steps more and the tuned one does."""
    times = StepTimes({"float32": [1.0] * 6, "float16": [1.02] * 6})

    def run(number, config, skipped):
        return sampled(
            number,
            config,
            steps_to_target=100,
            time_to_target_s=102.0,
            skipped_steps=skipped,
            min_scale=1.0,
        )

    tuned = AmpConfig(init_scale=256.0)
    assert candidates([run(1, tuned, 0), run(2, AmpConfig(), 2)], times, None)[0].number == 2
    assert candidates([run(1, tuned, 0), run(2, AmpConfig(), 10)], times, None)[0].number == 1


def test_ties_within_the_timing_noise_go_to_stability_not_to_noise():
    times = StepTimes(
        {
            "float32": [1.0] * 6,
            "bfloat16": [1.0, 0.9, 1.1, 1.0, 0.95, 1.05],
            "float16": [1.02, 0.9, 1.12, 1.0, 0.97, 1.08],
        }
    )
    fp16 = _outcome(1, "float16", 100, skipped=3, min_scale=1.0)
    bf16 = _outcome(2, "bfloat16", 101)
    assert [o.number for o in candidates([fp16, bf16], times, None)] == [2, 1]
    # Within one dtype the step time is the same: fewer steps win, stability or not.
    steady = _outcome(3, "float16", 102, skipped=0, min_scale=1024.0)
    assert [o.number for o in candidates([fp16, steady], times, None)] == [1, 3]
    # Equal and equally stable: the simpler config (fewer knobs away from the defaults).
    plain, clipped = _outcome(4, "bfloat16", 100), _outcome(5, "bfloat16", 100, clip=1.0)
    assert [o.number for o in candidates([clipped, plain], times, None)] == [4, 5]


def test_a_float8_tie_goes_to_the_recipe_nearer_torchaos_default():
    """rowwise_with_gw_hp is rowwise with the weight gradient in high precision too (slower
    on a GPU): tied with rowwise, it loses, as rowwise with a layer kept out loses to plain
    rowwise."""
    times = StepTimes({"float32": [1.0] * 6, "float8": [4.0] * 6})

    def run(number, **knobs):
        return sampled(
            number, AmpConfig(dtype="float8", **knobs), steps_to_target=100, time_to_target_s=400.0
        )

    gw_hp = run(1, float8_recipe="rowwise_with_gw_hp")
    rowwise = run(2, float8_recipe="rowwise")
    island = run(3, float8_recipe="rowwise", fp32_modules=("head",))
    assert [o.number for o in candidates([gw_hp, rowwise], times, None)] == [2, 1]
    assert [o.number for o in candidates([island, rowwise], times, None)] == [2, 3]


def test_a_run_beaten_by_its_own_dtype_is_not_tied_in_by_another_dtypes_spread():
    # Seen on the codepoints example under load: float16's spread (1.1-3.7x) overlapped both
    # bfloat16 runs, and "bfloat16, no clip" (200 steps, no knob changed) won the tie over
    # "bfloat16, clip" (105 steps), though the same dtype makes 105 steps surely faster.
    times = StepTimes(
        {
            "float32": [1.0] * 6,
            "bfloat16": [1.3, 1.7, 1.9, 1.7, 1.6, 2.0],
            "float16": [1.1, 1.5, 3.7, 1.4, 1.2, 3.6],
        }
    )
    # (5 skipped steps: beyond the max(2, 20%) within which skip counts are the same)
    fp16 = _outcome(9, "float16", 100, skipped=5, min_scale=0.002)
    bf16_clip = _outcome(5, "bfloat16", 105, clip=12.4)
    bf16_plain = _outcome(1, "bfloat16", 200)
    ranking = sorted([fp16, bf16_clip, bf16_plain], key=lambda o: o.time_to_target)
    order = [o.number for o in candidates(ranking, times, None)]
    assert order == [5, 9, 1]


@pytest.mark.parametrize("spread", [0.0, 0.05, 0.3, 1.5])
@pytest.mark.parametrize("horizon", [0, 150])
@pytest.mark.parametrize("timed", ["every dtype", "float16 untimed", "none"])
def test_every_pair_compared_at_once_is_surely_faster_pair_by_pair(spread, horizon, timed):
    """The ranking compares all its candidates at once (faster_pairs, over arrays): the same
    answer as surely_faster for every pair, ties of steps and of step times included."""
    rng = random.Random(f"{spread} {horizon} {timed}")
    rounds = {
        "float32": [1.0] * 6,
        "bfloat16": [0.6, 0.5, 0.7, 0.6, 0.55, 0.65],
        "float16": [0.55, 0.5, 0.9, 0.6, 0.5, 0.6],
        "float8": [0.4] * 6,
    }
    if timed == "float16 untimed":
        del rounds["float16"]
    times = None if timed == "none" else StepTimes(rounds)
    runs = [
        _outcome(n, rng.choice(["float16", "bfloat16", "float32", "float8"]), rng.randint(1, 300))
        for n in range(120)
    ]
    noise = Noise(spread=spread, horizon=horizon)
    at_once = faster_pairs(runs, times, noise)
    assert [[bool(x) for x in row] for row in at_once] == [
        [surely_faster(a, b, times, noise) for b in runs] for a in runs
    ]


def test_all_tied_only_when_no_config_that_reached_the_target_beats_another():
    times = StepTimes(
        {
            "float32": [1.0] * 6,
            "bfloat16": [1.0, 0.9, 1.1, 1.0, 0.95, 1.05],
            "float16": [1.02, 0.9, 1.12, 1.0, 0.97, 1.08],
        }
    )
    a, b = _outcome(1, "bfloat16", 100), _outcome(2, "float16", 101)
    assert all_tied([a, b], times)
    assert not all_tied([a], times)  # one config is no comparison
    far = _outcome(3, "bfloat16", 150)
    assert not all_tied([a, b, far], times)  # 100 steps beat 150 on bfloat16
    # within float32's seed-to-seed spread over a horizon of 2000, 50 steps are a tie
    assert all_tied([a, far], times, Noise(0.04, 2000))


def test_skipped_steps_match_the_optimizer_steps_gradscaler_really_skipped():
    # 194994.52 is not a float32: GradScaler holds it as 194994.515625.
    for init_scale in (194994.52, 2.0**24, 1.0):
        workloads.CountingAdam.built.clear()
        record = run_config(
            workloads.counted_overflow,
            AmpConfig(init_scale=init_scale),
            steps=30,
            seed=0,
            device=CPU,
        )
        (optimizer,) = workloads.CountingAdam.built
        assert len(record.skipped) == record.steps_run - optimizer.calls, init_scale
    assert skipped_steps([194994.515625] * 3, 194994.52) == []


def test_a_reference_that_does_not_learn_is_refused_before_any_trial_and_leaves_no_study(tmp_path):
    db = tmp_path / "study.db"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalertune",
            "search",
            spec("seed_article_toy"),
            "--storage",
            f"sqlite:///{db}",
            "--n-trials",
            "2",
            "--steps",
            "40",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "did not learn" in lines[-1] and "--steps" in lines[-1]
    assert "Traceback" not in proc.stderr
    assert not db.exists(), "the database this command created is left behind"
    # In a storage that already holds a study, the refused one leaves no study either.
    optuna.create_study(study_name="kept", storage=f"sqlite:///{db}")
    again = subprocess.run(proc.args, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert again.returncode == 2, again.stderr
    assert optuna.get_all_study_names(f"sqlite:///{db}") == ["kept"]


def test_target_learned_needs_a_drop_beyond_the_batch_noise():
    flat = Target.from_reference([7.128e8 + (i % 3) * 1e6 for i in range(200)])
    assert not flat.reference_learned
    learns = Target.from_reference([10.0 * 0.98**i for i in range(200)])
    assert learns.reference_learned


def test_target_learned_needs_a_target_below_where_float32_started():
    # 5% lower at the end, steadily: beyond the noise and the 1% floor, but the target (10%
    # above the end) is above the start, where a run that never steps "reaches" it at once
    barely = Target.from_reference([100.0 - 0.025 * i for i in range(200)])
    assert barely.loss > barely.reference_start and not barely.reference_learned
    assert barely.steps_to_target([100.0] * 20) == 1  # what it would have judged
    with pytest.raises(scalertune.UsageError, match="must lie below where it started"):
        barely.check_learned(200)


def test_the_timing_leaves_the_weights_where_they_start():
    workload = build_workload(workloads.healthy, seed=0, device=CPU)
    before = [p.detach().clone() for p in workload.model.parameters()]
    lrs = [g["lr"] for g in workload.optimizer.param_groups]
    time_dtypes(workload, ["bfloat16", "float16"], device=CPU, clip_norm=None)
    assert all(torch.equal(a, b) for a, b in zip(before, workload.model.parameters()))
    assert [g["lr"] for g in workload.optimizer.param_groups] == lrs


def test_across_dtypes_steps_that_tie_leave_the_step_time_to_decide():
    # Seen by a new user on a TransformerEncoder over a horizon of 1000: both dtypes reached
    # the target at step 90, bfloat16's steps cost 1.40-1.43x float32's and float16's
    # 1.58-1.61x, and the horizon's step margin (58 steps) tied them all.
    times = StepTimes(
        {
            "float32": [1.0] * 6,
            "bfloat16": [1.40, 1.41, 1.42, 1.43, 1.41, 1.42],
            "float16": [1.58, 1.59, 1.60, 1.61, 1.60, 1.59],
        }
    )
    bf16, fp16 = _outcome(2, "bfloat16", 90), _outcome(1, "float16", 90, min_scale=1.0)
    noise = Noise(0.058, 1000)
    assert not all_tied([bf16, fp16], times, noise)
    assert [o.number for o in candidates([fp16, bf16], times, None, noise)][0] == 2
    # overlapping step-time spreads still tie, and the tie goes to stability and simplicity
    close = StepTimes(
        {
            "float32": [1.0] * 6,
            "bfloat16": [1.40, 1.5, 1.6, 1.45, 1.55, 1.5],
            "float16": [1.45, 1.55, 1.5, 1.6, 1.5, 1.52],
        }
    )
    assert all_tied([bf16, fp16], close, noise)


def test_the_timing_records_the_cpus_load_per_core_while_it_ran():
    import os

    workload = build_workload(workloads.healthy, seed=0, device=CPU)
    times = time_dtypes(workload, ["bfloat16"], device=CPU, clip_norm=None)
    if not hasattr(os, "getloadavg"):
        assert times.load is None
        return
    assert times.load is not None and 0 <= times.load < 1000
    assert times.busy == (times.load > 1.5)
