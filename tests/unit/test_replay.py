"""The replay of a loss scaler over the float32 reference's gradient trace: GradScaler's and
DeepSpeed's update rules float for float against the real classes, the many-config replay
against the one-config one, the start-up probe against real float16 runs, and what a
prediction promises."""

import math

import numpy as np
import pytest
import torch
import workloads
from conftest import example, spec

import scalertune
from scalertune import AmpConfig
from scalertune._errors import ParameterError
from scalertune._limits import FLOAT32_MAX
from scalertune._replay._deepspeed import (
    AT_INFINITY,
    AT_MINIMUM,
    DeepSpeedScaler,
    replay_deepspeed,
    replay_fp16_block,
    update_deepspeed_scales,
)
from scalertune._replay._gradscaler import (
    STOP_CHECK_EVERY,
    limits,
    replay,
    replay_many,
    update_scales,
)
from scalertune._replay._predict import PHASES, SKIPS_LISTED, predict, predict_deepspeed
from scalertune._run._loop import Plan, run_config
from scalertune._run._trace_collector import TraceCollector
from scalertune._search._replay_choice import differs, fewest_skips, pick

CPU = torch.device("cpu")
FLOAT32 = AmpConfig(dtype="float32")


def _random_config(rng, extreme=False):
    """A float16 config with non-power-of-two factors, growth intervals from 1 (every step)
    through the block lengths of ``replay_many`` (8, 64) to hundreds, and (``extreme``) an
    initial scale anywhere in float32's range."""
    init = 2.0 ** rng.uniform(-60, 127) if extreme else 2.0 ** rng.uniform(-4, 24)
    growth = rng.choice([rng.uniform(1.0001, 8.0), 2.0, rng.uniform(1.25, 4.0)])
    backoff = rng.choice([rng.uniform(0.01, 0.999), 0.5, rng.uniform(0.125, 0.75)])
    interval = rng.choice([1, 2, 3, 7, 8, 9, 63, 64, 65, rng.integers(1, 60), rng.integers(1, 400)])
    return AmpConfig(
        init_scale=float(min(init, 3.4e38)),
        growth_factor=float(growth),
        backoff_factor=float(backoff),
        growth_interval=int(interval),
    )


def _streak(skipped):
    """The length of the start-up streak: the steps skipped in a row from step 0."""
    return next((i for i, t in enumerate(skipped) if t != i), len(skipped))


# -- GradScaler's rule, against GradScaler ------------------------------------------------------


def _gradscaler_run(config, inject):
    """A real ``GradScaler("cpu")`` training a tiny model, with an inf written into one
    gradient on the steps ``inject`` marks: its scale after each ``update()``, and whether it
    found an inf on each step (read between ``step`` and ``update``)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    scaler = torch.amp.GradScaler(
        "cpu",
        init_scale=config.init_scale,
        growth_factor=config.growth_factor,
        backoff_factor=config.backoff_factor,
        growth_interval=config.growth_interval,
    )
    x, y = torch.randn(4, 3), torch.randn(4, 2)
    scales, found = [], []
    for bad in inject:
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(torch.nn.functional.mse_loss(model(x), y)).backward()
        if bad:
            model.weight.grad[0, 0] = math.inf
        scaler.step(optimizer)
        found.append(sum(v.item() for v in scaler._found_inf_per_device(optimizer).values()) > 0)
        scaler.update()
        scales.append(scaler._scale.item())
    return np.array(scales, np.float64), np.array(found)


def _knobs(config):
    return {
        k: getattr(config, k)
        for k in ("init_scale", "growth_factor", "backoff_factor", "growth_interval")
    }


def test_update_scales_is_gradscalers_scale_float_for_float():
    rng = np.random.default_rng(1)
    grew = backed_off = 0
    for n in range(40):
        config = _random_config(rng, extreme=n % 5 == 0)
        inject = rng.random(80) < rng.choice([0.0, 0.02, 0.1, 0.4, 0.8])
        scales, found = _gradscaler_run(config, inject)
        # GradScaler's own found_inf: at scales below ~3e-39 its 1/scale is inf in float32
        # and every step overflows, injected or not
        ours = update_scales(found, **_knobs(config)).astype(np.float64)
        assert np.array_equal(ours, scales), config
        before = np.concatenate([[np.float32(config.init_scale)], scales[:-1]])
        grew, backed_off = grew + (scales > before).sum(), backed_off + (scales < before).sum()
    assert grew > 100 and backed_off > 100


def test_update_scales_is_the_update_kernel_where_a_growth_would_reach_inf():
    rng = np.random.default_rng(2)
    refused = 0
    for _ in range(30):
        config = AmpConfig(
            init_scale=float(2.0 ** rng.uniform(110, 127)),
            growth_factor=float(rng.uniform(1.5, 8.0)),
            backoff_factor=float(rng.uniform(0.1, 0.9)),
            growth_interval=int(rng.integers(1, 5)),
        )
        found = rng.random(200) < 0.1
        scale = torch.full((), config.init_scale, dtype=torch.float32)
        tracker, flag = torch.zeros((), dtype=torch.int32), torch.zeros(())
        theirs = []
        for bad in found:
            flag.fill_(float(bad))
            torch._amp_update_scale_(
                scale,
                tracker,
                flag,
                config.growth_factor,
                config.backoff_factor,
                config.growth_interval,
            )
            theirs.append(scale.item())
        ours = update_scales(found, **_knobs(config))
        assert np.array_equal(ours.astype(np.float64), theirs), config
        refused += (ours.astype(np.float64) * config.growth_factor > FLOAT32_MAX).any()
    assert refused > 10  # the scale sat where one more growth would be inf, and stayed


# -- DeepSpeed's rule, against DeepSpeed --------------------------------------------------------


@pytest.fixture
def deepspeed_logs_on_one_rank(monkeypatch):
    """DeepSpeed's scaler asks for the process's rank only to decide who logs an overflow:
    rank 0 without a process group (whose setup compiles a shared-memory op on a CPU)."""
    import deepspeed.comm

    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda group=None: 0)


def _dynamic_loss_scaler(scaler, overflows):
    """ZeRO's own ``DynamicLossScaler`` fed ``overflows``: its scale after each update, and the
    step at which it raised."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

    theirs = DynamicLossScaler(
        init_scale=scaler.init_scale,
        scale_window=scaler.scale_window,
        min_scale=scaler.min_scale,
        delayed_shift=scaler.delayed_shift,
        consecutive_hysteresis=scaler.consecutive_hysteresis,
        raise_error_at_min_scale=scaler.raise_error_at_min_scale,
    )
    scales = []
    for step, overflow in enumerate(overflows):
        try:
            theirs.update_scale(bool(overflow))
        except OverflowError:  # int(inf) in its overflow log line
            return scales, step, AT_INFINITY
        except Exception as exc:  # noqa: BLE001 - DeepSpeed raises a bare Exception at the minimum
            assert "minimum" in str(exc)
            return scales, step, AT_MINIMUM
        scales.append(theirs.cur_scale)
    return scales, None, None


def test_the_deepspeed_rule_is_zeros_dynamic_loss_scaler(deepspeed_logs_on_one_rank):
    rng = np.random.default_rng(4)
    endings = {AT_INFINITY: 0, AT_MINIMUM: 0, None: 0}
    for n in range(150):
        scaler = DeepSpeedScaler(
            # one in five starts within a few doublings of float64's range
            init_scale=float(
                2.0 ** int(rng.integers(1000, 1024) if n % 5 == 0 else rng.integers(-2, 33))
            ),
            scale_window=int(rng.choice([1, 2, 5, rng.integers(1, 300)])),
            min_scale=float(rng.choice([1.0, 0.25, 2.0**-10, 0.0, 3.0])),
            delayed_shift=int(rng.choice([1, 2, 3, 5])),
            consecutive_hysteresis=bool(rng.random() < 0.5),
            raise_error_at_min_scale=bool(rng.random() < 0.5),
        )
        overflows = rng.random(400) < rng.choice([0.01, 0.05, 0.2, 0.5])
        scales, raised_at, why = _dynamic_loss_scaler(scaler, overflows)
        ours, our_raise = update_deepspeed_scales(overflows, scaler)
        assert ours.tolist() == scales and our_raise == raised_at, scaler
        endings[why] += 1
        # over a trace: the replay's overflows, fed to DeepSpeed, give DeepSpeed's own scales
        amax = rng.lognormal(0, 3, 400)
        played = replay_deepspeed(amax, scaler, per_step=True)
        bits = np.isin(np.arange(400), played.skipped)
        scales, raised_at, why = _dynamic_loss_scaler(scaler, bits)
        assert (played.raised_at, played.raised) == (raised_at, why)
        # the scale in effect during step t + 1 is the one after step t's update
        shared = min(len(scales), 399)
        assert played.scales[1 : shared + 1].tolist() == scales[:shared]
    assert min(endings.values()) >= 10


def test_without_zero_the_deepspeed_rule_is_fp16_optimizers_update():
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.loss_scaler import LossScaleConfig

    rng = np.random.default_rng(5)
    for _ in range(40):
        block = {
            "enabled": True,
            "loss_scale": 0,
            "initial_scale_power": int(rng.integers(0, 30)),
            "loss_scale_window": int(rng.integers(1, 100)),
            "hysteresis": int(rng.integers(1, 4)),
            "min_loss_scale": int(rng.integers(1, 4)),
        }
        scaler = DeepSpeedScaler.from_fp16_block(block, zero=False)
        args = {
            "init_scale": 2 ** block["initial_scale_power"],
            "scale_window": block["loss_scale_window"],
            "delayed_shift": block["hysteresis"],
            "consecutive_hysteresis": False,
            "min_scale": block["min_loss_scale"],
        }
        holder = type(
            "Holder",
            (),
            {"verbose": False, "loss_scale_config": LossScaleConfig(torch.half, True, 0, args)},
        )()
        overflows = rng.random(300) < rng.choice([0.02, 0.2, 0.6])
        theirs = []
        for overflow in overflows:
            FP16_Optimizer._update_scale(holder, bool(overflow))
            theirs.append(holder.loss_scale_config.cur_scale)
        ours, raised_at = update_deepspeed_scales(overflows, scaler)
        assert ours.tolist() == theirs and raised_at is None


def test_the_exported_fp16_block_replays_as_deepspeed_parses_it(deepspeed_logs_on_one_rank):
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler

    config = AmpConfig(init_scale=4096.0, growth_interval=7)
    data = scalertune.export(config, "deepspeed", micro_batch_size=1).build()
    fp16 = DeepSpeedConfig(data).float16_config
    theirs = CreateLossScaler(torch.half, fp16.loss_scale, True, fp16.dynamic_loss_scale_args())
    amax = np.random.default_rng(6).lognormal(0, 2, 500)
    played = replay_fp16_block(amax, data["fp16"], per_step=True)
    for step, limit in enumerate(limits(amax)):
        if step == played.raised_at:
            with pytest.raises(Exception, match="minimum"):
                theirs.update_scale(True)
            break
        assert played.scales[step] == theirs.cur_scale
        theirs.update_scale(theirs.cur_scale >= limit)
    assert len(played.skipped) > 20


# -- many configs at once -----------------------------------------------------------------------


def _traces(steps=3000):
    rng = np.random.default_rng(3)
    holes = np.exp(rng.normal(0, 1, steps))
    holes[rng.random(steps) < 0.01] = np.inf
    holes[rng.random(steps) < 0.01] = 0.0
    holes[::997] = np.nan
    return {
        "lognormal": np.exp(rng.normal(0, 1.5, steps)) * 10,
        "trend and spikes": np.exp(np.linspace(3, -2, steps) + rng.normal(0, 0.5, steps))
        * np.where(rng.random(steps) < 0.01, 1e3, 1),
        "inf, NaN and 0": holes,
    }


def _configs_and_probe(seed):
    """60 random configs (one in seven extreme) and a start-up probe of four batches."""
    rng = np.random.default_rng(seed)
    configs = [_random_config(rng, extreme=n % 7 == 0) for n in range(60)]
    return configs, np.exp(rng.normal(3, 1, 4))


@pytest.mark.parametrize("name", list(_traces()))
def test_replay_many_is_replay_of_each_config(name):
    amax = _traces()[name]
    configs, probe = _configs_and_probe(7)
    for startup in (None, probe):
        many = replay_many(amax, configs, startup=startup)
        for n, config in enumerate(configs):
            one = replay(amax, config, startup=startup, lag=False)
            assert many.n_skipped[n] == len(one.skipped)
            assert np.array_equal(many.skipped(n), one.skipped)
            assert (many.min_scale[n], many.final_scale[n]) == (one.min_scale, one.final_scale)


@pytest.mark.parametrize("name", list(_traces()))
def test_replay_many_stopped_past_a_bound_is_the_full_replay_up_to_the_stop(name):
    amax = _traces()[name]
    configs, probe = _configs_and_probe(9)
    full = replay_many(amax, configs, startup=probe)
    bound = int(np.median(full.n_skipped))
    some = replay_many(amax, configs, startup=probe, stop_above=bound)
    # a config stops only once it has skipped more than the bound, and every one that has
    # by a check (one every STOP_CHECK_EVERY steps) before the last is stopped
    assert not some.stopped[full.n_skipped <= bound].any()
    assert (some.n_skipped[some.stopped] > bound).all()
    passed = np.array(
        [
            n > bound and full.skipped(i)[bound] < len(amax) - STOP_CHECK_EVERY
            for i, n in enumerate(full.n_skipped)
        ]
    )
    assert passed.any() and some.stopped[passed].all()
    for n in range(len(configs)):
        if some.stopped[n]:  # the same steps, up to where it stopped
            assert np.array_equal(full.skipped(n)[: some.n_skipped[n]], some.skipped(n))
        else:
            assert np.array_equal(full.skipped(n), some.skipped(n))
            assert (some.min_scale[n], some.final_scale[n]) == (
                full.min_scale[n],
                full.final_scale[n],
            )


def test_the_search_picks_the_same_setting_with_the_replay_stopped_at_the_defaults():
    trace = _reference(workloads.gradient_overflow, 1500)
    base = AmpConfig()
    rng = np.random.default_rng(10)
    configs = [base, *(_random_config(rng) for _ in range(200))]
    full = replay_many(trace.amax, configs, startup=trace.startup)
    fewest = configs.index(pick(trace, configs, full, None))
    assert full.n_skipped[fewest] < full.n_skipped[0]  # a setting that beats the defaults
    stopped = replay_many(
        trace.amax, configs, startup=trace.startup, stop_above=int(full.n_skipped[0])
    ).stopped
    assert stopped.sum() > len(configs) // 2  # the bound stopped most of them
    assert fewest_skips(trace, base, configs, len(trace.amax), None) is configs[fewest]


def test_the_start_up_streak_reads_the_probe_and_then_the_trace():
    amax = _traces()["lognormal"]
    probe = np.array([3e3, 5e3, 2e3])
    for config in (AmpConfig(), AmpConfig(init_scale=2.0**24, backoff_factor=0.7)):
        played = replay(amax, config, startup=probe, lag=False)
        streak = _streak(played.skipped)
        assert streak > 3
        # the same as the trace alone with its first steps (the streak and the step that ends
        # it) taken from the probe: the weights did not move until then
        seen = amax.copy()
        seen[: streak + 1] = np.resize(probe, streak + 1)
        assert np.array_equal(replay(seen, config).skipped, played.skipped)


def test_per_step_scales_are_the_rule_fed_the_replayed_overflows():
    amax = _traces()["trend and spikes"]
    rng = np.random.default_rng(8)
    for config in (_random_config(rng) for _ in range(10)):
        played = replay(amax, config, per_step=True)
        found = np.zeros(len(amax), bool)
        found[played.skipped] = True
        after = update_scales(found, **_knobs(config))
        assert np.array_equal(played.scales[1:], after[:-1])
        assert played.scales[0] == np.float32(config.init_scale)


# -- the start-up probe, against real float16 runs -----------------------------------------------


def _reference(factory, steps):
    return run_config(
        factory, FLOAT32, steps=steps, seed=0, device=CPU, plan=Plan(watcher=TraceCollector(steps))
    ).trace


@pytest.mark.parametrize(
    "factory, configs",
    [
        (
            example("codepoints").make_model,
            [
                AmpConfig(),
                AmpConfig(init_scale=2.0**20, backoff_factor=0.3),
                AmpConfig(init_scale=1024.0, backoff_factor=0.6),
                AmpConfig(init_scale=2.0**24),
            ],
        ),
        (workloads.gradient_overflow, [AmpConfig(), AmpConfig(init_scale=2.0**24)]),
    ],
    ids=["codepoints", "gradient_overflow"],
)
def test_the_start_up_probe_predicts_a_real_runs_start_up_streak(factory, configs):
    trace = _reference(factory, 40)
    # the probe's first batch is the trace's first step: the same weights, the same batch
    assert trace.startup[0] == trace.amax[0]
    for config in configs:
        real = _streak(
            run_config(factory, config, steps=40, seed=0, device=CPU, prune=False).skipped
        )
        assert 0 < real < 40
        assert _streak(replay(trace.amax, config, startup=trace.startup).skipped) == real
        assert _streak(replay_many(trace.amax, [config], startup=trace.startup).skipped(0)) == real


def test_without_the_probe_the_trace_misreads_the_start_up_of_a_fast_learner():
    # Adam at lr 0.5 raises codepoints' gradients 13x in 12 steps: the trace's model moves
    # during the streak, the skipping run's does not
    trace = _reference(example("codepoints").make_model, 40)
    real = run_config(
        example("codepoints").make_model, AmpConfig(), steps=40, seed=0, device=CPU, prune=False
    ).skipped
    alone = replay(trace.amax, AmpConfig()).skipped
    assert (
        _streak(alone)
        > _streak(real)
        == _streak(replay(trace.amax, AmpConfig(), startup=trace.startup).skipped)
    )


# -- predictions --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def codepoints_trace():
    return _reference(example("codepoints").make_model, 200)


def test_a_prediction_counts_where_the_skips_fall(codepoints_trace):
    predicted = predict(codepoints_trace, AmpConfig(growth_interval=20))
    played = replay(
        codepoints_trace.amax, AmpConfig(growth_interval=20), startup=codepoints_trace.startup
    )
    assert predicted.horizon == 200 and predicted.skipped_steps == len(played.skipped)
    assert predicted.skipped_at == tuple(played.skipped[:SKIPS_LISTED])
    assert len(predicted.skipped_per_phase) == PHASES
    assert sum(predicted.skipped_per_phase) == predicted.skipped_steps
    assert predicted.startup_skips >= _streak(played.skipped) > 0
    assert predicted.describe().startswith(f"skips {predicted.startup_skips} steps in the first")
    assert "of 200 (" in predicted.describe()


def test_a_prediction_cannot_reach_past_its_trace(codepoints_trace):
    assert predict(codepoints_trace, AmpConfig(), horizon=50).horizon == 50
    with pytest.raises(ParameterError, match="horizon is 500 steps, but the trace covers 200"):
        predict(codepoints_trace, AmpConfig(), horizon=500)
    with pytest.raises(ValueError, match="horizon"):
        predict(codepoints_trace, AmpConfig(), horizon=0)


def test_the_replay_tells_a_setting_from_the_defaults_only_beyond_the_noise(codepoints_trace):
    """The article's init_scale=4096 starts 4 halvings below the defaults: 4 fewer start-up
    skips of 25, within max(2, 20%), so its run would tie with theirs and is not trained;
    2**24 skips 8 more, told apart unless float32's seed spread over the horizon covers it."""
    from types import SimpleNamespace

    quiet, noisy = (SimpleNamespace(spread=s, horizon=200) for s in (0.0, 0.05))
    defaults, article, high = (
        AmpConfig(),
        AmpConfig(init_scale=4096.0),
        AmpConfig(init_scale=2.0**24),
    )
    skips = {c: predict(codepoints_trace, c).skipped_steps for c in (defaults, article, high)}
    assert skips[defaults] - skips[article] == 4 and skips[high] - skips[defaults] == 8
    assert not differs(codepoints_trace, defaults, article, quiet)
    assert differs(codepoints_trace, defaults, high, quiet)
    assert differs(codepoints_trace, high, defaults, quiet)  # either way round
    assert not differs(codepoints_trace, defaults, high, noisy)  # 8 steps < 5% of 200


def test_bfloat16_and_float32_are_predicted_without_a_scaler(codepoints_trace):
    for dtype in ("bfloat16", "float32"):
        predicted = predict(codepoints_trace, AmpConfig(dtype=dtype))
        assert predicted.skipped_steps == 0 and predicted.min_scale == predicted.final_scale == 1
        assert "no loss scaler" in predicted.describe()


def test_a_small_scale_flushes_the_gradients_of_a_tiny_loss():
    trace = _reference(workloads.underflow, 30)
    flat = predict(trace, AmpConfig(init_scale=1.0, growth_interval=1000))
    kept = predict(trace, AmpConfig(init_scale=2.0**24, growth_interval=1000))
    assert min(flat.flushed) > 0.25 and max(kept.flushed) < 0.01
    assert "flush to zero" in flat.describe() and "flush" not in kept.describe()


def test_deepspeed_under_zero_ends_where_the_scale_meets_its_minimum(codepoints_trace):
    # codepoints' gradients overflow float16 even unscaled: at the minimum scale of 1 the
    # weights never move, and ZeRO's scaler raises on its next overflow
    block = scalertune.export(AmpConfig(), "deepspeed").build()["fp16"]
    zero = predict_deepspeed(codepoints_trace, block)
    assert zero.stops_at == 16 and zero.stop_reason == AT_MINIMUM  # 2**16 halved 16 times
    said = zero.describe()  # what it skips is of the steps it trains, not of the horizon
    assert said.startswith("skips 17 of the 17 steps it trains, down to scale 2**0;"), said
    assert "ends training at step 16 of 200" in said and "then none" not in said
    plain = predict_deepspeed(codepoints_trace, block, zero=False)
    assert plain.stops_at is None and plain.skipped_steps == 200 and plain.min_scale == 1
    with pytest.raises(ParameterError, match="enable fp16"):
        predict_deepspeed(codepoints_trace, {"loss_scale": 0})


def test_a_replay_that_misses_most_runs_draws_no_scaler_advice(tmp_path):
    """The replay replays float32's gradients: where float16's runs skipped otherwise than it
    predicts for most of them (float16 changing the gradients, an activation overflowing now
    and then), the replay check says the replay is no evidence here, and the scaler's advice
    ("keep them", "worth it") is not drawn from it. Where it holds, both read as before."""
    import dataclasses

    import optuna

    from scalertune._judge._answer import judge
    from scalertune._review._scaler_advice import replay_agreement, scaler_advice

    storage = f"sqlite:///{tmp_path / 's.db'}"
    scalertune.search(
        spec("gradient_overflow"),
        storage=storage,
        space="float16",
        n_trials=3,
        steps=40,
        device="cpu",
        study_name="s",
    )
    found = judge(optuna.load_study(study_name="s", storage=storage))
    held = replay_agreement(found)
    assert held is not None and "no evidence" not in held
    assert "no advice" not in (scaler_advice(found) or "")

    def skipping_more(outcome):
        if not outcome.config.uses_scaler:
            return outcome
        more = int(outcome.figures.skipped_steps or 0) + 10
        return dataclasses.replace(
            outcome, figures=dataclasses.replace(outcome.figures, skipped_steps=more)
        )

    missed = dataclasses.replace(found, ranking=[skipping_more(o) for o in found.ranking])
    said = replay_agreement(missed)
    assert said is not None and "match what they really skipped" in said
    assert "the replay does not hold for this workload" in said
    advice = scaler_advice(missed)
    assert advice is not None and "so no advice is drawn from it here" in advice
    assert "keep them" not in advice and "worth it" not in advice
