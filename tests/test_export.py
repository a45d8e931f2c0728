"""Taking the recommendation into training code: exports fed to the real frameworks, the guard."""

import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import scalertune
from scalertune import AmpConfig, AmpGuardError, AmpRuntime, Guard
from conftest import example, spec

FLOAT16 = AmpConfig(dtype="float16", init_scale=1000.0, growth_factor=3.0, backoff_factor=0.25,
                    growth_interval=7, clip_norm=1.5)
BFLOAT16 = AmpConfig(dtype="bfloat16", clip_norm=2.0)


def _code(config, framework, **kwargs):
    return scalertune.export(config, framework, **kwargs).replace('device = "cuda"',
                                                                   'device = "cpu"')


def _run(code):
    namespace = {}
    exec(compile(code, "<export>", "exec"), namespace)
    return namespace


def _batches():
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)),
                                       batch_size=16)


def test_torch_export_builds_the_scaler_it_names_and_trains():
    ns = _run(_code(FLOAT16, "torch"))
    scaler = ns["scaler"]
    assert (scaler.get_scale(), scaler.get_growth_factor(), scaler.get_backoff_factor(),
            scaler.get_growth_interval()) == (1000.0, 3.0, 0.25, 7)
    code = scalertune.export(FLOAT16, "torch")
    assert "clip_grad_norm_(model.parameters(), 1.5)" in code
    assert code.index("unscale_") < code.index("clip_grad_norm_") < code.index("scaler.step")


@pytest.mark.parametrize("config", [FLOAT16, BFLOAT16], ids=["float16", "bfloat16"])
def test_lightning_export_runs_real_steps_with_the_exported_scaler(config):
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    ns = _run(_code(config, "lightning"))
    trainer = pl.Trainer(**ns["trainer_kwargs"], max_steps=3, accelerator="cpu", logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Module(), _batches())
    assert trainer.global_step == 3
    assert trainer.gradient_clip_val == config.clip_norm
    plugin = trainer.precision_plugin
    if config.dtype == "float16":
        scaler = plugin.scaler
        assert (scaler._init_scale, scaler._growth_factor, scaler._backoff_factor,
                scaler._growth_interval) == (1000.0, 3.0, 0.25, 7)
    else:
        assert plugin.precision == "bf16-mixed"


@pytest.mark.parametrize("config", [FLOAT16, BFLOAT16], ids=["float16", "bfloat16"])
def test_accelerate_export_runs_real_steps_with_the_exported_settings(config):
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # Accelerate keeps one per process
    ns = _run(_code(config, "accelerate"))
    accelerator = ns["accelerator"]
    assert accelerator.mixed_precision == {"float16": "fp16", "bfloat16": "bf16"}[config.dtype]
    if config.dtype == "float16":
        # exactly what Accelerate passes to GradScaler on a GPU
        assert accelerator.scaler_handler.to_kwargs() == {
            "init_scale": 1000.0, "growth_factor": 3.0, "backoff_factor": 0.25,
            "growth_interval": 7}
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, _batches())
    for x, y in loader:
        with accelerator.autocast():
            loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        norm = accelerator.clip_grad_norm_(model.parameters(), config.clip_norm)
        optimizer.step()
        optimizer.zero_grad()
        assert torch.isfinite(loss) and torch.isfinite(norm)


# TrainingArguments' documented precision and clipping fields (transformers docs).
TRANSFORMERS_FIELDS = {"output_dir", "fp16", "bf16", "max_grad_norm"}


def test_transformers_export_says_what_it_cannot_express():
    code = scalertune.export(FLOAT16, "transformers")
    call = code[code.index("TrainingArguments(") + len("TrainingArguments("):code.rindex(")")]
    assert {part.split("=")[0].strip() for part in call.split(",")} <= TRANSFORMERS_FIELDS
    assert "fp16=True" in code and "max_grad_norm=1.5" in code
    for knob in ("init_scale=1000.0", "growth_factor=3.0", "backoff_factor=0.25",
                 "growth_interval=7"):
        assert f"# NOT EXPRESSIBLE: {knob}" in code
    assert "max_grad_norm=0.0" in scalertune.export(AmpConfig(dtype="bfloat16"), "transformers")
    with pytest.raises(scalertune.UsageError, match="transformers cannot express"):
        scalertune.export(FLOAT16, "transformers", strict=True)
    scalertune.export(AmpConfig(dtype="bfloat16", clip_norm=1.0), "transformers", strict=True)


# DeepSpeed's documented fp16/bf16/clipping keys (deepspeed.ai/docs/config-json).
DEEPSPEED_KEYS = {
    "fp16": {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
             "hysteresis", "consecutive_hysteresis", "min_loss_scale"},
    "bf16": {"enabled"},
    "gradient_clipping": None,
}


def test_deepspeed_export_uses_documented_keys_and_the_nearest_power_of_two():
    code = scalertune.export(FLOAT16, "deepspeed")
    ds = _run(code)["ds_config"]
    assert set(ds) <= set(DEEPSPEED_KEYS)
    assert set(ds["fp16"]) <= DEEPSPEED_KEYS["fp16"]
    assert ds["fp16"]["initial_scale_power"] == 10  # 1000 -> 2**10
    assert ds["fp16"]["loss_scale_window"] == 7 and ds["gradient_clipping"] == 1.5
    assert "# NOT EXPRESSIBLE: init_scale=1000.0 is not a power of two" in code
    assert "# NOT EXPRESSIBLE: growth_factor=3.0" in code
    assert "# NOT EXPRESSIBLE: backoff_factor=0.25" in code
    exact = AmpConfig(init_scale=4096.0, growth_interval=500)
    assert "NOT EXPRESSIBLE" not in scalertune.export(exact, "deepspeed", strict=True)
    assert _run(scalertune.export(BFLOAT16, "deepspeed"))["ds_config"]["bf16"] == {"enabled": True}


def test_export_command_and_strict_exit_status(tmp_path):
    path = tmp_path / "amp.yaml"
    path.write_text("config:\n  dtype: float16\n  init_scale: 1000.0\n  growth_factor: 3.0\n")
    ok = subprocess.run([sys.executable, "-m", "scalertune", "export", str(path), "--to",
                         "deepspeed"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "initial_scale_power" in ok.stdout
    strict = subprocess.run([sys.executable, "-m", "scalertune", "export", str(path), "--to",
                             "deepspeed", "--strict"], capture_output=True, text=True, timeout=120)
    assert strict.returncode == 2 and "deepspeed cannot express" in strict.stderr
    assert len(strict.stderr.strip().splitlines()) == 1


def test_guard_stops_a_run_whose_forward_overflows_and_says_why():
    parts = example("attention").make_model()
    amp = AmpRuntime(AmpConfig(), device="cpu", guard=Guard())
    with pytest.raises(AmpGuardError, match="overflows float16 in the forward pass") as caught:
        for _ in range(10):
            for batch in parts["batches"]:
                amp.train_step(parts["model"], parts["optimizer"], parts["loss_fn"], batch)
    assert "scalertune diagnose" in str(caught.value)
    assert amp.steps <= 60


def test_guard_stays_quiet_on_healthy_training():
    import workloads

    parts = workloads.healthy()
    amp = AmpRuntime(AmpConfig(), device="cpu", guard=Guard())
    for _ in range(25):
        for batch in parts["batches"]:
            amp.train_step(parts["model"], parts["optimizer"], parts["loss_fn"], batch)
    assert amp.steps == 100


@pytest.mark.slow
def test_the_yaml_carries_a_guard_from_the_evidence_and_load_enables_it(storage, tmp_path):
    result = scalertune.search(spec("healthy"), storage=storage, space="float16",
                               n_trials=2, steps=60, device="cpu")
    assert result.recommended is not None and result.recommended.config.dtype == "float16"
    path = str(tmp_path / "amp.yaml")
    result.to_yaml(path)
    guard = result.guard()
    lowest = min(min(o.scales) for o in [result.recommended,
                                         *result.confirmations[result.recommended.number].values()])
    assert guard.min_scale == pytest.approx(max(lowest / 2**10, 2.0**-24), rel=1e-5)
    assert guard.max_consecutive_skips >= 50
    amp = scalertune.load(path, device="cpu")
    assert amp.guard == guard
    assert scalertune.load(path, device="cpu", guard=False).guard is None


@pytest.mark.slow
def test_a_lightning_module_is_searched_through_its_own_training_step(storage):
    result = scalertune.search(spec("lightning_module"), storage=storage, n_trials=2, steps=40,
                               device="cpu")
    assert result.reference is not None
    assert result.recommended is not None
    assert all(o.state in ("complete", "pruned") for o in result.ranking)
