"""The watch: a training run whose loss scaler leaves the search's prediction is told so, once,
early; a run that does what was predicted never is."""

import warnings

import pytest
import torch
import workloads
import yaml

import scalertune
from scalertune import AmpConfig, AmpRuntime
from scalertune._amp._schema import prediction_of, read_result
from scalertune._amp._watch import AmpDriftWarning, ScalerPrediction, Watch
from scalertune._replay._predict import predict
from scalertune._run._loop import Plan, run_config
from scalertune._run._trace_collector import TraceCollector
from scalertune._workload._factory import build_workload

CPU = torch.device("cpu")
HORIZON = 600
#: Gradients of about 1e3 (a summed loss): 2**24 backs off for 19 steps, then grows every 100.
CONFIG = AmpConfig(init_scale=2.0**24, growth_interval=100)


@pytest.fixture(scope="module")
def predicted():
    """What the search would write: the replay of CONFIG over the float32 reference's trace."""
    reference = run_config(
        workloads.gradient_overflow,
        AmpConfig(dtype="float32"),
        steps=HORIZON,
        seed=0,
        device=CPU,
        plan=Plan(watcher=TraceCollector(HORIZON)),
    )
    p = predict(reference.trace, CONFIG, horizon=HORIZON)
    return ScalerPrediction(
        horizon=HORIZON,
        skipped_steps=p.skipped_steps,
        skipped_first=p.startup_skips,
        min_scale=p.min_scale,
        final_scale=p.final_scale,
    )


def _train(config, watch, *, seed=0, steps=HORIZON, loss_times=lambda step: 1.0, fused=False):
    """Train gradient_overflow under ``config`` with ``watch``; the step of each warning."""
    workload = build_workload(workloads.gradient_overflow, seed=seed, device=CPU)
    if fused:
        workload.optimizer = torch.optim.Adam(workload.model.parameters(), lr=0.02, fused=True)
    amp = AmpRuntime(config, device=CPU, watch=watch)
    batches, warned = workload.batches, []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            times = loss_times(step)
            amp.train_step(
                workload.model,
                workload.optimizer,
                lambda out, y, times=times: times * workload.loss_fn(out, y),
                batches[step % len(batches)],
            )
            warned += [(step, w) for w in caught[len(warned) :]]
    return amp, warned


@pytest.mark.parametrize("seed", [0, 1])
def test_a_run_that_does_what_the_search_predicted_never_warns(predicted, seed):
    amp, warned = _train(CONFIG, Watch(predicted), seed=seed)
    assert warned == []
    assert amp.skipped_steps >= predicted.skipped_first  # it did skip: the watch looked


@pytest.mark.parametrize("fused", [False, True], ids=["adam", "fused-adam"])
def test_a_much_larger_loss_warns_once_early_saying_what_differs(predicted, fused):
    amp, warned = _train(CONFIG, Watch(predicted), loss_times=lambda step: 2.0**10, fused=fused)
    assert [type(w.message) for _, w in warned] == [AmpDriftWarning]
    step, warning = warned[0]
    assert step < 50
    text = str(warning.message)
    assert f"where the search predicted {predicted.skipped_first}" in text
    assert "gradients are at least 512 times larger" in text
    assert "The run is no longer the one the search saw" in text
    assert "rerun scalertune search on it" in text
    assert warning.filename == __file__  # it points at the training code's own line


def test_gradients_that_grow_later_warn_when_the_scaler_backs_off_past_the_prediction(predicted):
    amp, warned = _train(
        CONFIG, Watch(predicted), loss_times=lambda step: 2.0**12 if step >= 300 else 1.0
    )
    assert len(warned) == 1
    step, warning = warned[0]
    assert 300 <= step < 330
    assert "in its first" in str(warning.message) and "below the lowest" in str(warning.message)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_configs_without_a_loss_scaler_are_not_watched(predicted, dtype):
    amp, warned = _train(
        AmpConfig(dtype=dtype), Watch(predicted), loss_times=lambda step: 2.0**10, steps=50
    )
    assert amp.watch is None and warned == []


def _result_file(tmp_path, evidence):
    path = tmp_path / "result.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "scalertune": 1,
                "config": CONFIG.to_dict(),
                "guard": {"min_scale": 2.0**-14, "max_consecutive_skips": 50},
                "evidence": evidence,
            }
        )
    )
    return str(path)


def test_a_result_file_without_a_prediction_loads_as_before(tmp_path):
    path = _result_file(tmp_path, {"horizon": HORIZON})
    amp = scalertune.load(path, device="cpu")
    assert amp.config == CONFIG and amp.guard.max_consecutive_skips == 50
    assert amp.watch is None and prediction_of(read_result(path), path) is None


def test_the_prediction_block_gives_the_loaded_runtime_its_watch(tmp_path, predicted):
    block = {
        "horizon": HORIZON,
        "skipped_steps": predicted.skipped_steps,
        "skipped_first": predicted.skipped_first,
        "min_scale": predicted.min_scale,
        "final_scale": predicted.final_scale,
    }
    path = _result_file(tmp_path, {"horizon": HORIZON, "prediction": block})
    assert scalertune.load(path, device="cpu").watch == Watch(predicted)
    assert scalertune.load(path, device="cpu", watch=False).watch is None


@pytest.mark.parametrize(
    "block, problem",
    [
        ({"horizon": 600, "skipped_steps": 19}, "needs horizon, skipped_steps, skipped_first"),
        (
            {
                "horizon": 600,
                "skipped_steps": 19,
                "skipped_first": 25,
                "min_scale": 1.0,
                "final_scale": 1.0,
            },
            "skipped_first <= skipped_steps",
        ),
        (
            {
                "horizon": 600,
                "skipped_steps": 19.5,
                "skipped_first": 15,
                "min_scale": 1.0,
                "final_scale": 1.0,
            },
            "skipped_steps must be an integer",
        ),
        (
            {
                "horizon": 600,
                "skipped_steps": 19,
                "skipped_first": 15,
                "min_scale": 0,
                "final_scale": 1.0,
            },
            "min_scale must be a finite number > 0",
        ),
    ],
)
def test_a_broken_prediction_block_names_what_is_wrong(tmp_path, block, problem):
    path = _result_file(tmp_path, {"prediction": block})
    with pytest.raises(scalertune.UsageError, match=problem):
        scalertune.load(path, device="cpu")


def test_the_allowance_is_the_start_up_and_the_rest_pro_rata_plus_twice_the_error():
    watch = Watch(
        ScalerPrediction(
            horizon=3000, skipped_steps=19, skipped_first=15, min_scale=0.125, final_scale=4096.0
        )
    )
    # 15 + 4 * t / 3000 + 2 * max(2, 20% of 19)
    assert watch.allowed_skips(0) == pytest.approx(15 + 7.6)
    assert watch.allowed_skips(3000) == pytest.approx(19 + 7.6)
    assert watch.allowed_skips(30000) == pytest.approx(55 + 2 * 0.2 * 55)


def test_best_amp_loads_the_amp_config_a_float32_answer_carries_with_its_guard(tmp_path, predicted):
    """A search on a CPU answers float32 (AMP steps are slower there); ``best_amp=True``
    loads the AMP config that held, its guard, and the watch on its prediction."""
    block = {
        "horizon": HORIZON,
        "skipped_steps": predicted.skipped_steps,
        "skipped_first": predicted.skipped_first,
        "min_scale": predicted.min_scale,
        "final_scale": predicted.final_scale,
    }
    path = tmp_path / "result.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "scalertune": 1,
                "config": AmpConfig(dtype="float32").to_dict(),
                "evidence": {
                    "horizon": HORIZON,
                    "prediction": block,
                    "best_amp": {
                        "config": CONFIG.to_dict(),
                        "guard": {"min_scale": 2.0**-10, "max_consecutive_skips": 60},
                    },
                },
            }
        )
    )
    answer = scalertune.load(str(path), device="cpu")
    assert answer.config.dtype == "float32" and answer.guard is None and answer.watch is None
    amp = scalertune.load(str(path), device="cpu", best_amp=True)
    assert scalertune.load_config(str(path), best_amp=True) == CONFIG == amp.config
    assert amp.guard.max_consecutive_skips == 60 and amp.watch == Watch(predicted)


def test_best_amp_from_a_file_without_one_says_to_train_with_its_config(tmp_path):
    path = _result_file(tmp_path, {"horizon": HORIZON})
    with pytest.raises(scalertune.UsageError, match="no evidence.best_amp: no AMP config held"):
        scalertune.load(path, device="cpu", best_amp=True)


def test_a_watch_the_in_run_check_rebased_names_its_replay_not_the_search(predicted):
    """A new user's report: after the check set the scaler's knobs from its replay, the next
    action said the scale was "512 times below the lowest the search predicted (1.05e+06)",
    where the search had predicted 6.55e+04 (the same report's last line). A watch rebased on
    the replay's prediction says whose it is, and keeps saying it after a resume."""
    from scalertune._amp._readback import REPLAYED, Readback

    readback = Readback(None, Watch(predicted), None)
    replayed = ScalerPrediction(
        horizon=1000, skipped_steps=2, min_scale=2.0**20, final_scale=2.0**20
    )
    readback.rebase(replayed, steps=520, skipped=20)
    said = readback.watch.differences(  # counted from the rebase
        CONFIG, steps=440, skipped=2, startup=0, startup_last=0, scale=2048.0
    )
    assert said == [
        "the loss scale is 2.05e+03, 512 times below the lowest the in-run check's replay "
        "predicted (1.05e+06): gradients overflow float16 at scales the in-run check's "
        "replay saw hold"
    ]
    resumed = Readback(None, Watch(predicted), None)
    resumed.load_state_dict(readback.state_dict())
    assert resumed.watch == readback.watch and resumed.watch.by == REPLAYED
    assert Watch(predicted).by == "the search"
