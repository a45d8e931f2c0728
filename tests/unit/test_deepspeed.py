"""DeepSpeed as the workload: its fp16 block as a config, each run in DeepSpeed's engine under
DeepSpeed's own loss scaler, checked against DeepSpeed's own training of the same workload
(``deepspeed_workloads.deepspeed_training``) and its own config parser."""

import os
import pathlib
import re

import deepspeed_workloads as dsw
import pytest
import torch

import scalertune
from scalertune import AmpConfig, CheckPolicy, SearchSpace, UsageError
from scalertune._amp._config import DEEPSPEED_BASELINES, DeepSpeedFp16Config
from scalertune._amp._schema import write_result
from scalertune._judge._rank import skip_tolerance
from scalertune._replay._predict import predict
from scalertune._run._loop import Plan, run_config
from scalertune._run._trace_collector import TraceCollector
from scalertune._search._setup import _space_for
from scalertune._workload._factory import build_workload

CPU = torch.device("cpu")
#: A start far above what the regression's gradients hold, backing off on every overflow.
HIGH = DeepSpeedFp16Config(init_scale=2.0**20, hysteresis=1, growth_interval=20)
#: DeepSpeed's hysteresis at 3: two of every three overflows leave the scale where it is.
LAZY = DeepSpeedFp16Config(init_scale=2.0**18, hysteresis=3, growth_interval=10, clip_norm=1.0)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def test_an_fp16_block_is_a_config_deepspeed_parses_back_to_the_same_scaler():
    from deepspeed.runtime.config import DeepSpeedConfig

    block = {"enabled": True, "initial_scale_power": 12, "hysteresis": 3, "min_loss_scale": 4}
    config = DeepSpeedFp16Config.from_fp16_block(block, clip_norm=0.5)
    assert AmpConfig.from_dict(config.to_dict()) == config != AmpConfig(init_scale=4096.0)
    parsed = DeepSpeedConfig({**dsw.CONFIG, "fp16": config.fp16_block()}).float16_config
    assert (parsed.initial_scale_power, parsed.hysteresis, parsed.min_loss_scale) == (12, 3, 4)
    assert (parsed.loss_scale_window, parsed.consecutive_hysteresis) == (1000, False)
    assert config.describe() == (
        "float16 DeepSpeed scale=2**12 window 1000 hysteresis 3 min 4, clip 0.5"
    )


def test_deepspeeds_own_test_values_are_read_as_deepspeed_reads_them():
    """DeepSpeed's tests write ``min_loss_scale: 2.0``, ``hysteresis: 1.0`` and
    ``consecutive_hysteresis: 1``, which its config (pydantic) takes as 2, 1 and true."""
    from deepspeed.runtime.config import DeepSpeedConfig

    block = {"enabled": True, "initial_scale_power": 8.0, "min_loss_scale": 2.0}
    block |= {"hysteresis": 1.0, "consecutive_hysteresis": 1, "loss_scale_window": 100.0}
    ours = DeepSpeedFp16Config.from_fp16_block(block)
    theirs = DeepSpeedConfig({**dsw.CONFIG, "fp16": block}).float16_config
    assert (
        (ours.initial_scale_power, ours.min_loss_scale, ours.hysteresis)
        == (
            theirs.initial_scale_power,
            theirs.min_loss_scale,
            theirs.hysteresis,
        )
        == (8, 2, 1)
    )
    assert ours.consecutive_hysteresis is theirs.consecutive_hysteresis is True
    assert ours.growth_interval == theirs.loss_scale_window == 100


def test_an_export_of_the_largest_scale_is_a_block_predict_reads():
    from scalertune._replay._deepspeed_block import deepspeed_fp16_block

    block = deepspeed_fp16_block(AmpConfig(init_scale=3.4028234663852886e38))
    assert block["initial_scale_power"] == 127
    assert DeepSpeedFp16Config.from_fp16_block(block).initial_scale_power == 127


@pytest.mark.parametrize(
    ("block", "said"),
    [
        ({"enabled": False}, "must enable fp16"),
        ({"enabled": True, "loss_scale": 128}, "a static scale"),
        ({"enabled": True, "initial_scale_power": "auto"}, "'auto' values"),
        ({"enabled": True, "initial_scale_power": 12.5}, "initial_scale_power"),
        ({"enabled": True, "hysteresis": 0}, "hysteresis must be an integer >= 1"),
        ({"enabled": True, "loss_scale_windw": 10}, "unknown key(s) loss_scale_windw"),
    ],
)
def test_an_fp16_block_deepspeed_would_not_scale_with_is_refused_in_one_line(block, said):
    with pytest.raises(UsageError, match=re.escape(said)) as caught:
        DeepSpeedFp16Config.from_fp16_block(block)
    assert "\n" not in str(caught.value)


def test_a_run_in_deepspeed_trains_and_skips_as_deepspeed_itself():
    for config in (HIGH, LAZY, AmpConfig(dtype="float32", clip_norm=1.0)):
        record = run_config(dsw.regression, config, steps=30, seed=0, device=CPU)
        block = config.fp16_block() if isinstance(config, DeepSpeedFp16Config) else None
        losses, skipped, scale = dsw.deepspeed_training(
            dsw.regression, block, 30, clipping=config.clip_norm
        )
        assert record.losses == pytest.approx(losses, rel=1e-6, abs=0), config
        assert len(record.skipped) == skipped, config
        if block is not None:
            assert record.scales[-1] == scale and skipped > 0
    # with hysteresis, most of the skipped steps leave the scale as it was
    lazy = run_config(dsw.regression, LAZY, steps=30, seed=0, device=CPU)
    drops = sum(b < a for a, b in zip([LAZY.init_scale, *lazy.scales], lazy.scales))
    assert len(lazy.skipped) > drops > 0


def test_a_float16_branch_starts_from_float32s_checkpoint_as_float32_goes_on(tmp_path):
    path = str(tmp_path / "step20.pt")
    float32 = AmpConfig(dtype="float32", clip_norm=1.0)
    reference = run_config(
        dsw.regression, float32, steps=40, seed=0, device=CPU, plan=Plan(save_at={20: path})
    )
    again = run_config(dsw.regression, float32, steps=40, seed=0, device=CPU, plan=Plan(path))
    assert again.losses == reference.losses[20:]  # the optimizer's state, exactly
    scaler = {"scale": 512.0, "hysteresis": 1, "iteration": 20}
    scaler["last_overflow"] = 15  # no growth due at once
    branch = run_config(
        dsw.regression,
        HIGH,
        steps=40,
        seed=0,
        device=CPU,
        plan=Plan(path, scaler=scaler),
    )
    assert branch.scales[0] == 512.0 and branch.skipped == []
    assert branch.losses[0] == pytest.approx(reference.losses[20], rel=1e-2)


def test_the_float32_reference_traces_the_gradients_zero_keeps_from_the_parameters():
    record = run_config(
        dsw.regression,
        AmpConfig(dtype="float32", clip_norm=1.0),
        steps=20,
        seed=0,
        device=CPU,
        plan=Plan(watcher=TraceCollector(20)),
    )
    # the first step's largest parameter gradient, as plain torch computes it
    from scalertune._workload._rng import seed_everything

    seed_everything(0)
    parts = dsw.regression()
    x, y = parts["batches"][0]
    parts["loss_fn"](parts["model"](x), y).backward()
    largest = max(float(p.grad.abs().max()) for p in parts["model"].parameters())
    assert record.trace.param_amax[0] == pytest.approx(largest, rel=1e-5)
    assert record.trace.startup[0] >= largest


def test_the_replay_of_a_trace_predicts_what_deepspeed_skips():
    steps = 80
    reference = run_config(
        dsw.regression,
        AmpConfig(dtype="float32", clip_norm=1.0),
        steps=steps,
        seed=0,
        device=CPU,
        plan=Plan(watcher=TraceCollector(steps)),
    )
    blocks = [
        {"enabled": True},
        {"enabled": True, "initial_scale_power": 22, "loss_scale_window": 5, "hysteresis": 1},
        {"enabled": True, "initial_scale_power": 16, "loss_scale_window": 25, "hysteresis": 1},
    ]
    for block in blocks:
        _, skipped, _ = dsw.deepspeed_training(dsw.regression, block, steps)
        predicted = predict(
            reference.trace, DeepSpeedFp16Config.from_fp16_block(block, clip_norm=1.0)
        )
        assert abs(predicted.skipped_steps - skipped) <= skip_tolerance(skipped), block
        assert skipped > 0


@pytest.mark.parametrize(
    ("factory", "said"),
    [
        (dsw.with_config(bf16={"enabled": True}), "enables both fp16 and bf16"),
        (dsw.with_config(zero_optimization={"stage": 3}), "ZeRO stage 3"),
        (dsw.with_config(zero_optimization=None), "without ZeRO"),
        (dsw.with_config(train_micro_batch_size_per_gpu="auto"), "'auto' values"),
        (dsw.with_config(optimizer={"type": "Adam"}), "names one too"),
        (lambda: dsw.regression(optimizer=False), "names none"),
        (lambda: {**dsw.regression(), "clip_norm": 1.0}, "gradient_clipping"),
    ],
)
def test_a_deepspeed_workload_that_cannot_be_searched_is_refused_in_one_line(factory, said):
    with pytest.raises(UsageError, match=re.escape(said)) as caught:
        build_workload(factory, seed=0, device=CPU)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("auto_cast", [True, False])
def test_deepspeeds_own_auto_cast_key_is_no_auto_value(auto_cast):
    """``fp16.auto_cast`` is DeepSpeed's own key, not a value a Hugging Face Trainer fills in
    (``"auto"``): a workload with it is built, and its config keeps it."""
    from scalertune._workload._deepspeed import read_config

    config = {**dsw.CONFIG, "fp16": {"enabled": True, "auto_cast": auto_cast}}
    assert read_config(config)["fp16"]["auto_cast"] is auto_cast
    build_workload(dsw.with_config(fp16=config["fp16"]), seed=0, device=CPU)


def test_an_engine_deepspeed_made_already_is_refused_in_one_line():
    def made():
        parts = dsw.regression()
        from scalertune._frameworks._deepspeed import initialize

        initialize(parts["model"], parts["optimizer"], {**dsw.CONFIG, "fp16": {"enabled": False}})
        return parts

    with pytest.raises(UsageError, match="made by deepspeed.initialize already"):
        build_workload(made, seed=0, device=CPU)


def test_the_space_of_a_deepspeed_workload_is_in_deepspeeds_knobs():
    space = _space_for(SearchSpace.load("default"), {"zero_stage": 2, "bfloat16": False})
    assert space.dtypes == ("float16",)  # no bfloat16 where the device has none
    assert space.params["initial_scale_power"] == {"low": 0, "high": 24}
    assert {"hysteresis", "min_loss_scale", "consecutive_hysteresis"} <= set(space.params)
    import optuna

    study = optuna.create_study(sampler=space.sampler(seed=0))
    for _ in range(5):
        trial = study.ask()
        config = space.suggest(trial)
        assert isinstance(config, DeepSpeedFp16Config)
        assert space.params_for(config) is not None
        study.tell(trial, 1.0)
    for config in DEEPSPEED_BASELINES.values():
        assert space.params_for(config) is not None
    with pytest.raises(UsageError, match="DeepSpeed's loss scaler's knobs"):
        _space_for(SearchSpace.from_dict({"hysteresis": 2}, name="mine"), None)
    with pytest.raises(UsageError, match="casts the whole model"):
        _space_for(SearchSpace.load("default").with_islands("0"), {"zero_stage": 2})


def test_a_deepspeed_answer_exports_as_the_config_deepspeed_parses(tmp_path):
    from deepspeed.runtime.config import DeepSpeedConfig

    path = str(tmp_path / "amp.yaml")
    write_result({"config": LAZY.to_dict()}, path)
    exported = scalertune.export(path, "deepspeed", micro_batch_size=dsw.BATCH)
    data = exported.build()
    assert data["fp16"] == LAZY.fp16_block() and data["gradient_clipping"] == 1.0
    assert exported.not_expressible == () and exported.differences == ()
    parsed = DeepSpeedConfig(data).float16_config
    assert (parsed.enabled, parsed.hysteresis, parsed.initial_scale_power) == (True, 3, 18)
    with pytest.raises(UsageError, match="export it --to deepspeed"):
        scalertune.export(path, "torch")
    with pytest.raises(UsageError, match=r"answer .*amp.yaml --to deepspeed"):
        scalertune.load(path, device="cpu")
    assert os.path.exists(path)


def test_a_deepspeed_result_says_how_to_take_it_where_load_cannot(tmp_path):
    """A DeepSpeed answer's file says in its header to export it or attach it, not to load
    it; a float32 answer whose best AMP config is DeepSpeed's block says, in its header and
    in the line ``load`` warns, to export that block, not ``best_amp=True`` (which
    ``load`` refuses for it)."""
    answer = str(tmp_path / "deepspeed.yaml")
    write_result({"config": LAZY.to_dict()}, answer)
    head = pathlib.Path(answer).read_text(encoding="utf-8").split("scalertune: 1")[0]
    assert "scalertune export deepspeed.yaml --to deepspeed" in head
    assert "scalertune.load" not in head
    float32 = str(tmp_path / "float32.yaml")
    best = {"config": LAZY.to_dict()}
    write_result({"config": {"dtype": "float32"}, "evidence": {"best_amp": best}}, float32)
    head = pathlib.Path(float32).read_text(encoding="utf-8").split("scalertune: 1")[0]
    assert "scalertune export float32.yaml --best-amp --to deepspeed" in head
    assert "best_amp=True" not in head
    with pytest.warns(scalertune.AmpCheckWarning) as said:
        scalertune.load(float32, device="cpu")
    (line,) = [str(w.message) for w in said]
    assert "--best-amp --to deepspeed prints it" in line and "best_amp=True" not in line
    # the export the refusal names prints that block, not the float32 answer
    with pytest.raises(UsageError, match="best AMP config .*float32.yaml --best-amp --to deep"):
        scalertune.load(float32, device="cpu", best_amp=True)


def test_an_export_keeps_what_the_searched_fp16_block_held_beside_its_scaler(tmp_path):
    """``auto_cast`` (the inputs cast to float16) trained in every run of the search: the
    exported config keeps it under the answer's scaler."""
    from deepspeed.runtime.config import DeepSpeedConfig

    path = str(tmp_path / "amp.yaml")
    searched = {**dsw.CONFIG, "fp16": {"enabled": True, "auto_cast": True}}
    write_result({"config": LAZY.to_dict(), "evidence": {"deepspeed": {"config": searched}}}, path)
    data = scalertune.export(path, "deepspeed").build()
    assert data["fp16"] == {**LAZY.fp16_block(), "auto_cast": True}
    assert DeepSpeedConfig(data).float16_config.auto_cast is True


def test_a_deepspeed_trainer_refuses_what_its_engine_cannot_take_in_one_line():
    from scalertune._frameworks._deepspeed import init_trainer_engine

    trainer = dsw.trainer(max_steps=2)
    with pytest.raises(UsageError, match="GradScaler's, searched outside DeepSpeed") as caught:
        scalertune.attach(trainer, AmpConfig(init_scale=4096.0))
    assert "\n" not in str(caught.value)
    init_trainer_engine(trainer, 2)  # what train() does first
    with pytest.raises(UsageError, match="engine is made already"):
        scalertune.attach(trainer, HIGH)


def test_a_run_deepspeed_ends_at_its_floor_is_pruned_saying_so():
    floor = DeepSpeedFp16Config(init_scale=2.0**20, hysteresis=1, min_loss_scale=2**18)
    record = run_config(dsw.regression, floor, steps=20, seed=0, device=CPU)
    assert record.prune_kind == "scale-collapse" and record.steps_run == 2
    assert "minimum loss scale (262144)" in record.prune_reason
    with pytest.raises(Exception, match="Current loss scale already at minimum"):
        dsw.deepspeed_training(dsw.regression, floor.fp16_block(), 20)  # DeepSpeed's own


def test_an_attached_deepspeed_trainer_trains_without_the_in_run_checks_float32_forward():
    """DeepSpeed's engine casts the model itself to float16 and keeps the float32 master
    weights in its optimizer: a float32 forward at the model's weights is no float32 check,
    so attach leaves the check out, whatever ``check=`` asks for, and says so in one line
    where it was asked for (by default, silently)."""
    import warnings

    from scalertune._frameworks._deepspeed import process_group

    process_group()  # the environment torchrun gives a Trainer's process
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        quiet = scalertune.attach(dsw.trainer(max_steps=3), HIGH)
    assert quiet.check is None
    assert not [w for w in said if issubclass(w.category, scalertune.AmpCheckWarning)]
    trainer = dsw.trainer(max_steps=3)
    with pytest.warns(scalertune.AmpCheckWarning) as said:
        amp = scalertune.attach(trainer, HIGH, check=CheckPolicy(every=1))
    (line,) = [str(w.message) for w in said if issubclass(w.category, scalertune.AmpCheckWarning)]
    assert "in-run check is left out of a DeepSpeed Trainer" in line and "\n" not in line
    assert said[0].filename == __file__  # pointed at the attach line
    forwards = []
    trainer.model.register_forward_pre_hook(
        lambda module, args: forwards.append(next(module.parameters()).dtype)
    )
    trainer.train()
    assert amp.check is None and amp.steps == 3 and amp.skipped_steps > 0
    assert forwards == [torch.float16] * 3  # one forward a step, the engine's own
    assert amp.skipped_steps == trainer.model_wrapped.skipped_steps
