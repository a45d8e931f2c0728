"""The phases of a horizon: where finalists are branched, and the paired verdict on each
branch against float32's own continuation over the same steps."""

import math
import random

import numpy as np
import pytest
import workloads
from outcomes import sampled

import scalertune
from scalertune import _policy
from scalertune._judge._phases import judge_phase
from scalertune._judge._settings import StudySettings
from scalertune._replay._forecast import forecast, trends
from scalertune._replay._trace import empty


def phase_windows(horizon, steps):
    """The windows of a study of ``steps``-step trials over ``horizon``."""
    return StudySettings(
        factory="f.py:make_model",
        steps=steps,
        horizon=horizon,
        seed=0,
        space={},
        device_type="cpu",
        device="cpu",
    ).windows


def test_windows_sit_in_the_middle_and_at_the_end_of_the_horizon():
    assert phase_windows(2000, 200) == [(1000, 1200), (1800, 2000)]
    assert phase_windows(100_000, 200) == [(50_000, 60_000), (90_000, 100_000)]
    assert phase_windows(200, 200) == []  # the trial is the evidence
    assert phase_windows(500, 200) == [(300, 500)]  # too short for two: the end alone


def test_windows_start_where_the_reference_saves_a_checkpoint():
    # the reference saves at the end of a read-back window: a horizon that is no multiple of
    # it (a Trainer's epochs times its steps) branched from a step it never saved
    assert phase_windows(1234, 200) == [(620, 820), (1030, 1234)]
    assert phase_windows(24, 20) == [(10, 24)]  # barely past a trial: never from step 0
    for horizon in range(21, 700, 7):
        for start, end in phase_windows(horizon, 20):
            assert start % _policy.READBACK_INTERVAL == 0 and 0 < start < end <= horizon


def test_a_search_to_a_horizon_off_the_read_back_grid_branches_without_a_failed_run(storage):
    result = scalertune.search(
        workloads.healthy,
        storage=storage,
        steps=20,
        horizon=24,
        space="float16",
        n_trials=3,
        device="cpu",
    )
    assert result.failed == 0 and result.phases


def _noisy(mean, n=200, noise=0.05, seed=0):
    rng = random.Random(seed)
    return [mean * (1 + noise * rng.gauss(0, 1)) for _ in range(n)]


def test_a_branch_that_ties_float32_within_its_noise_holds():
    reference = _noisy(1.0)
    branch = [v * (1 + 0.02 * random.Random(1).gauss(0, 1)) for v in reference]
    result = judge_phase(branch, reference, start=1000, pruned=False)
    assert result.holds and 0.95 < result.ratio < 1.05


def test_a_branch_well_above_float32_falls_behind_and_says_by_how_much():
    reference = _noisy(1.0)
    branch = [2.0 * v for v in reference]
    result = judge_phase(branch, reference, start=1800, pruned=False)
    assert result.behind and not result.holds
    assert result.describe() == f"{result.ratio:.3g}x at 1800-2000" and result.ratio > 1.9


def test_a_noisy_excess_is_no_alarm_but_a_steady_one_is():
    """An excess above the tolerance on average, but no larger than the window's own noise,
    is not a finding; the same excess held steadily is."""
    rng = random.Random(3)
    reference = [1.0] * 200
    noisy = [1.0 + 0.3 + rng.gauss(0, 10.0) for _ in range(200)]
    assert not judge_phase(noisy, reference, start=0, pruned=False).behind
    steady = [1.0 + 2 * _policy.PHASE_TOLERANCE] * 200
    assert judge_phase(steady, reference, start=0, pruned=False).behind


def test_a_branch_that_dies_or_keeps_overflowing_goes_non_finite():
    reference = [1.0] * 200
    assert judge_phase([1.0] * 50, reference, start=0, pruned=True).nonfinite
    skipping = [math.inf if i % 10 == 0 else 1.0 for i in range(200)]  # 10% inf losses
    assert judge_phase(skipping, reference, start=0, pruned=False).nonfinite
    one_skip = [math.inf] + [1.0] * 199  # one skipped step is GradScaler doing its job
    assert judge_phase(one_skip, reference, start=0, pruned=False).holds


def _trace(peaks):
    trace = empty(("up", "down"))
    steps = len(peaks) * 10
    trace.amax = np.ones(steps, np.float32)
    trace.block_starts = np.arange(0, steps, 10)
    trace.forward = np.array(peaks, np.float32)
    trace.hist = np.zeros((len(peaks), trace.hist.shape[1]), np.int64)
    return trace


def test_a_forward_peak_that_grows_as_a_power_of_the_step_is_forecast_where_it_reaches_65504():
    blocks = np.arange(200)
    steps = blocks * 10 + 5.0  # each block's peak at its middle step
    up = 500.0 * (steps / 1000) ** 2  # 2000 at step 2000, 65504 at step ~11,446
    down = np.full(200, 3.0)
    found = forecast(_trace(np.stack([up, down], axis=1)), horizon=2000)
    assert [f.module for f in found] == ["up"]
    assert found[0].exponent == pytest.approx(2.0, rel=0.01)
    assert found[0].step == pytest.approx(1000 * (65504 / 500) ** 0.5, rel=0.01)
    assert found[0].earliest <= found[0].step <= found[0].latest


def test_no_trend_no_forecast():
    rng = np.random.default_rng(0)
    flat = np.stack([1000 * rng.lognormal(0, 0.3, 200), np.full(200, 3.0)], axis=1)
    assert forecast(_trace(flat), horizon=2000) == []


def test_a_forward_peak_that_levels_off_is_not_forecast():
    blocks = np.arange(200, dtype=np.float64)
    # an output approaching the size of its targets (500): up fast, then flat
    levelling = 500.0 * (1 - 0.9 * np.exp(-blocks / 60))
    found = forecast(_trace(np.stack([levelling, np.full(200, 3.0)], axis=1)), horizon=2000)
    assert found == []


def test_growth_that_speeds_up_past_a_power_of_the_step_is_not_forecast():
    """Flat, then growing as the 6th power from step 1500: not one power over the fitted
    half, so the model does not fit, and nothing is said."""
    steps = np.arange(200) * 10 + 5.0
    speeding = 400.0 * np.maximum(1.0, steps / 1500) ** 6
    found = forecast(_trace(np.stack([speeding, np.full(200, 3.0)], axis=1)), horizon=2000)
    assert found == []


def test_a_forecast_past_the_reach_it_was_measured_over_is_not_said():
    """Steady growth as the step to the power 0.5 from 2000 at step 2000 reaches 65504 near
    step 2.1 million, a thousand horizons out: too far to say."""
    steps = np.arange(200) * 10 + 5.0
    slow = 2000.0 * (steps / 2000) ** 0.5
    trace = _trace(np.stack([slow, np.full(200, 3.0)], axis=1))
    assert forecast(trace, horizon=2000) == []
    (trend,) = trends(trace, horizon=2000)
    assert trend.module == "up" and trend.exponent == pytest.approx(0.5, rel=0.01)
    assert trend.reaches(65504) == pytest.approx(2000 * (65504 / 2000) ** 2, rel=0.02)


def _windows(reference, spans):
    return {a: reference[a:b] for a, b in spans}


def test_a_run_from_step_0_is_judged_at_each_window_it_reached_and_stops_at_the_first_miss():
    from scalertune._judge._phases import judge_from_start

    spans = phase_windows(2000, 200)  # (1000, 1200), (1800, 2000)
    reference = _noisy(1.0, n=2000)
    windows = _windows(reference, spans)
    tracking = [v * 1.01 for v in reference]
    held = judge_from_start(tracking, windows, spans, pruned=False)
    assert [(p.start, p.holds, p.from_start) for p in held] == [
        (1000, True, True),
        (1800, True, True),
    ]
    stalled = reference[:800] + [2.0] * 1200  # a plateau of its own from step 800
    behind = judge_from_start(stalled, windows, spans, pruned=False)
    assert len(behind) == 1 and behind[0].behind and behind[0].start == 1000
    dead = judge_from_start(reference[:345], windows, spans, pruned=True, first_nonfinite=345)
    assert dead[0].nonfinite and dead[0].describe() == "non-finite at step 345"


def _reached(number, config):
    """A sampled run of ``config`` that reached the target at step 100."""
    return sampled(number, config, steps_to_target=100)


def test_a_dtype_ruled_out_from_step_0_holds_in_no_branch_of_its_own():
    """Branches of a dtype whose run from step 0 stalled (its forward at float32's weights as
    good as float32's) are no evidence; where the precision itself failed (the forward
    worse), only configs of the dtype with other float32 modules may still hold."""
    from scalertune import AmpConfig
    from scalertune._judge._horizon import RuledOut, holds
    from scalertune._judge._phases import PhaseResult

    spans = [(1000, 1200), (1800, 2000)]

    clipped = _reached(3, AmpConfig(dtype="bfloat16", clip_norm=1.0))
    island = _reached(7, AmpConfig(dtype="bfloat16", fp32_modules=("4",)))
    phases = {n: [PhaseResult(a, b, 1.0, 0.0, nonfinite=False) for a, b in spans] for n in (3, 7)}
    assert holds(clipped, phases, spans) is True
    stalled = {"bfloat16": RuledOut(5, 1000, 1200, forward=1.01, fp32_modules=())}
    assert holds(clipped, phases, spans, stalled) is False
    assert holds(island, phases, spans, stalled) is False
    precision = {"bfloat16": RuledOut(5, 1800, 2000, forward=2.2, fp32_modules=())}
    assert holds(clipped, phases, spans, precision) is False
    assert holds(island, phases, spans, precision) is True


def test_a_float8_recipe_that_falls_behind_rules_out_its_own_recipe_not_the_others():
    """tensorwise's per-tensor scale failing at float32's weights says nothing of rowwise's
    per-row scales: the rule is keyed by the recipe and the precision around float8, and the
    forward it is measured by runs the config's own recipe."""
    from scalertune import AmpConfig
    from scalertune._judge._horizon import RuledOut, holds, precision
    from scalertune._judge._phases import PhaseResult
    from scalertune._run._forward import precision_of

    spans = [(300, 400), (500, 600)]
    configs = {
        3: AmpConfig(dtype="float8", clip_norm=1.0),
        4: AmpConfig(dtype="float8", float8_recipe="rowwise"),
        5: AmpConfig(dtype="float8", float8_around="bfloat16"),
        6: AmpConfig(dtype="float8", float8_round_scales=True),
    }
    runs = {n: _reached(n, c) for n, c in configs.items()}
    phases = {n: [PhaseResult(a, b, 1.0, 0.0, nonfinite=False) for a, b in spans] for n in runs}
    tensorwise = AmpConfig(dtype="float8")
    assert precision(tensorwise) == "float8 tensorwise in float32"
    assert precision(AmpConfig(dtype="bfloat16")) == "bfloat16"
    ruled = {precision(tensorwise): RuledOut(9, 500, 600, forward=5.9, fp32_modules=())}
    held = {n: holds(o, phases, spans, ruled) for n, o in runs.items()}
    assert held == {3: False, 4: True, 5: True, 6: False}
    measured = precision_of(AmpConfig(dtype="float8", float8_recipe="rowwise", clip_norm=2.0))
    assert (measured.float8_recipe, measured.clip_norm) == ("rowwise", None)


def test_a_clip_that_falls_behind_in_branches_only_is_said_to_be_a_branchs_verdict():
    """A branch starts from float32's state, trained at the workload's own clip: for a config
    with another clip, falling behind there may be the clip taking over mid-run (a new user's
    clip 19.8 fell behind 1.56x in its branch, and ended at 0.65x float32's loss trained from
    step 0). Where the cost cap left no room for a run from step 0, its reason says so; a
    run at the workload's clip, or one trained from step 0, is said as before."""
    import types

    from scalertune import AmpConfig
    from scalertune._judge._phases import PhaseResult
    from scalertune._review._describe import why_not

    def described(clip_norm, *, from_start=False, nonfinite=False):
        run = sampled(5, AmpConfig(clip_norm=clip_norm), steps_to_target=160)
        behind = PhaseResult(200, 400, 1.56, 40.0, nonfinite=nonfinite, from_start=from_start)
        result = types.SimpleNamespace(
            phases={5: [behind]}, ruled={}, settings=types.SimpleNamespace(clip_norm=None)
        )
        assert not behind.holds
        return why_not(result, run)

    said = described(19.8)
    assert said.startswith("falls behind float32 by 200-400: 1.56x at 200-400")
    assert "where its clip takes over mid-run" in said and "no room" in said
    for other in (described(None), described(19.8, from_start=True)):
        assert "mid-run" not in other and "falls behind float32 by 200-400" in other
    assert "mid-run" not in described(19.8, nonfinite=True)


def test_a_run_from_step_0_that_reaches_a_windows_end_is_judged_on_its_last_half():
    """A spike in the first half of the window ending at the horizon is no verdict on a run
    that got to the horizon (the end is what the user's run is judged by); a run that stops
    inside the window is judged on the first half."""
    from scalertune._judge._phases import judge_from_start

    spans = [(1800, 2000)]
    reference = _noisy(1.0, n=2000)
    windows = _windows(reference, spans)
    spiky = reference[:1800] + [2.0] * 100 + reference[1900:2000]
    assert judge_from_start(spiky, windows, spans, pruned=False)[0].holds
    assert judge_from_start(spiky[:1900], windows, spans, pruned=False)[0].behind


def test_the_horizon_and_the_in_run_check_judge_by_one_rule():
    """A window of the horizon and the in-run check's recent checks fall behind by the same
    function (issue 51): at the default tolerance and z, over the edges of both bounds."""
    from scalertune._inrun import _gap
    from scalertune._judge import _phases

    edge = 1 + _policy.PHASE_TOLERANCE
    for ratio in (1.0, edge - 1e-9, edge, edge + 1e-9, 2.0, math.inf):
        for z in (0.0, _policy.PHASE_Z, _policy.PHASE_Z + 1e-9, math.inf):
            phase = _phases.PhaseResult(start=0, end=10, ratio=ratio, z=z, nonfinite=False)
            gap = _gap.Gap(ratio=ratio, z=z, checks=5)
            expected = _gap.falls_behind(ratio, z)
            assert phase.behind is expected
            assert gap.beyond(_policy.PHASE_TOLERANCE, _policy.PHASE_Z) is expected
    # the in-run check's policy moves the bounds of the same rule, not another one
    assert _gap.Gap(ratio=1.2, z=3.0, checks=5).beyond(0.1, 2.0)
    assert not _gap.Gap(ratio=1.2, z=3.0, checks=5).beyond(0.1, 4.0)
