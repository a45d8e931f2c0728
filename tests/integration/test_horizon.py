"""Verdicts that hold for the whole training run: with ``horizon``, what the search says of
each finalist in the late phases agrees with that config trained the whole horizon in a plain
GradScaler loop, and what it recommends (or carries as ``best_amp``) ends within the phase
tolerance of float32's loss there."""

import late_workloads
import torch
import yaml
from conftest import example
from plain_loop import ratio_at_the_end, skipped_steps

import scalertune
from scalertune import _policy
from scalertune._judge._rank import skip_tolerance
from scalertune._search import _policy as _search_policy

torch.set_num_threads(1)
TOLERANCE = 1 + _policy.PHASE_TOLERANCE


def _search(tmp_path, factory, horizon, **kwargs):
    tmp_path.mkdir(parents=True, exist_ok=True)
    return scalertune.search(
        factory,
        storage=f"sqlite:///{tmp_path / 'h.db'}",
        horizon=horizon,
        device="cpu",
        artifact_dir=str(tmp_path / "artifacts"),
        **kwargs,
    )


def _agrees_with_full_runs(result, factory):
    """Every verdict the search reached against the config's own full-length plain run: held
    means it ends within the tolerance of float32, fell behind means it does not. Finalists
    after the first that held and was confirmed are not judged (the answer takes them in
    order); the first finalist always is."""
    judged = [run for run in [*result.finalists, *result.islands] if result.holds(run) is not None]
    assert result.pool[0] in judged
    for run in judged:
        held = result.holds(run)
        ratio = ratio_at_the_end(factory, run.config, result.horizon)
        assert held is (ratio <= TOLERANCE), (run.label, run.config.describe(), held, ratio)


def test_a_precision_floor_that_opens_late_is_caught_and_float16_holds(tmp_path):
    """Readings near 1000: bfloat16 ties float32 for 1000 steps, then its 8 bits stop the fit
    (2.5x at 2000); PyTorch's float16 defaults, next in line, hold."""
    factory = late_workloads.readings_near_1000
    result = _search(tmp_path, "tests/late_workloads.py:readings_near_1000", 2000)
    plain_bf16 = next(
        f for f in result.finalists if f.config.dtype == "bfloat16" and f.config.clip_norm is None
    )
    assert result.holds(plain_bf16) is False
    _agrees_with_full_runs(result, late_workloads.readings_near_1000)
    assert result.best_amp is not None and result.holds(result.best_amp)
    assert ratio_at_the_end(factory, result.best_amp.config, 2000) <= TOLERANCE
    # what the search predicts the float16 answer's scaler does over the horizon, it does
    best = result.best_amp.config
    real = len(skipped_steps(factory, best, 2000))
    assert best.dtype == "float16" and real > 0
    assert abs(result.predict(best).skipped_steps - real) <= skip_tolerance(real)
    # the clipped bfloat16 run is ruled out by the plain one's precision, untrained
    clipped = next(
        f
        for f in result.finalists
        if f.config.dtype == "bfloat16" and f.config.clip_norm is not None
    )
    assert result.holds(clipped) is False and clipped.number not in result.phases
    result.to_yaml(str(tmp_path / "amp.yaml"))
    evidence = yaml.safe_load((tmp_path / "amp.yaml").read_text())["evidence"]
    assert evidence["horizon"] == 2000 and evidence["best_amp"]["config"]
    assert evidence["cost"]["run_equivalents"] <= _search_policy.HORIZON_COST_CAP
    assert "falls behind float32" in result.summary() and "steps 0-2000" in result.verdict


def test_an_island_is_tried_when_no_config_of_another_dtype_is_left_and_holds(tmp_path):
    """Readings near 1e5: float16 overflows in the forward (no float16 config reaches the
    target), bfloat16 falls behind with its precision; keeping the layer before the x100 in
    float32 is proposed, holds, and ends within the tolerance in a full-length plain loop."""
    factory = late_workloads.readings_near_1e5
    result = _search(tmp_path, "tests/late_workloads.py:readings_near_1e5", 2000)
    assert not any(c.config.dtype == "float16" for c in result.pool)
    island = (late_workloads.ISLAND["readings_near_1e5"],)
    assert result.best_amp is not None and result.best_amp.config.fp32_modules == island
    _agrees_with_full_runs(result, factory)
    assert ratio_at_the_end(factory, result.best_amp.config, 2000) <= TOLERANCE
    assert result.run_equivalents <= _search_policy.HORIZON_COST_CAP


def test_activations_that_grow_past_float16s_range_late_are_not_recommended(tmp_path):
    result = _search(tmp_path, "tests/late_workloads.py:growing_activations", 3000)
    _agrees_with_full_runs(result, late_workloads.growing_activations)
    best = result.best_amp
    assert best is not None
    assert best.config.dtype == "bfloat16" or "up" in best.config.fp32_modules


def test_a_config_that_follows_float32_but_stalls_on_its_own_way_is_caught_from_step_0(tmp_path):
    """The plateau MLP: bfloat16 holds in every branch from float32's weights but, trained
    from step 0 as the search trains its leading config, falls behind by mid-horizon; no
    bfloat16 config is then taken on its branches alone, and what the search carries as the
    best AMP config ends within the tolerance of float32 in a full-length plain loop."""
    result = _search(tmp_path, "tests/late_workloads.py:plateau_mlp", 2000, steps=100)
    leader = result.pool[0]
    assert leader.config.dtype == "bfloat16" and result.holds(leader) is False
    assert result.phases[leader.number][0].from_start
    assert all(result.holds(c) is not True for c in result.pool if c.config.dtype == "bfloat16")
    assert "trained from step 0" in result.summary()
    if result.best_amp is not None:
        assert (
            ratio_at_the_end(late_workloads.plateau_mlp, result.best_amp.config, 2000) <= TOLERANCE
        )
    assert result.run_equivalents <= _search_policy.HORIZON_COST_CAP + 0.05


def test_a_clip_that_helps_early_and_hurts_late_is_not_the_answer(tmp_path):
    result = _search(tmp_path, "tests/late_workloads.py:codepoints_fast", 2000)
    clipped = [f for f in result.finalists if f.config.clip_norm is not None]
    assert clipped and all(result.holds(f) is False for f in clipped)
    _agrees_with_full_runs(result, late_workloads.codepoints_fast)
    assert result.config.clip_norm is None
    assert result.best_amp is None or result.best_amp.config.clip_norm is None


def test_a_horizon_raises_no_alarm_where_every_config_trains_well(tmp_path):
    """The classifier trains under every sane config: over a horizon of 1000 the first
    finalist, trained from step 0, holds (so no other needs evidence), none falls behind, and
    the answer is the same dtype as without a horizon."""
    factory = example("classifier").make_model
    short = _search(tmp_path / "short", factory, None, steps=100, n_trials=6)
    long = _search(tmp_path / "long", factory, 1000, steps=100, n_trials=6)
    assert long.finalists and all(long.holds(f) is not False for f in long.finalists)
    assert long.holds(long.pool[0]) is True and long.phases[long.pool[0].number][0].from_start
    assert long.config.dtype == short.config.dtype
    assert long.best_amp is not None and "falls behind" not in long.summary()
