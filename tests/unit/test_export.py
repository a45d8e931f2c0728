"""Taking the recommendation into training code: every export is fed to the framework's own
parser or constructor and the knobs are read back from what it built; the guard; a
LightningModule searched as it is."""

import json
import warnings

import pytest
import torch
from conftest import example, run_cli, spec
from torch import nn

import scalertune
from scalertune import AmpConfig, AmpGuardError, AmpRuntime, Guard
from scalertune._amp._islands import is_island

FLOAT16 = AmpConfig(
    dtype="float16",
    init_scale=1000.0,
    growth_factor=3.0,
    backoff_factor=0.25,
    growth_interval=7,
    clip_norm=1.5,
)
BFLOAT16 = AmpConfig(dtype="bfloat16", clip_norm=2.0)
FLOAT32 = AmpConfig(dtype="float32", clip_norm=0.5)
#: The hand-made case: float16 below scale 1, no clipping, growth and backoff DeepSpeed lacks.
ODD = AmpConfig(
    dtype="float16", init_scale=0.125, growth_factor=3.0, backoff_factor=0.25, growth_interval=7
)
CONFIGS = [FLOAT16, BFLOAT16, FLOAT32, ODD]
IDS = ["float16", "bfloat16", "float32", "odd-float16"]


def _knobs(scaler):
    """What a GradScaler holds, read back through its own getters."""
    return (
        scaler.get_scale(),
        scaler.get_growth_factor(),
        scaler.get_backoff_factor(),
        scaler.get_growth_interval(),
    )


def _yaml_knobs(config):
    return (config.init_scale, config.growth_factor, config.backoff_factor, config.growth_interval)


def _exec(code, **names):
    namespace = dict(names)
    exec(compile(code, "<export>", "exec"), namespace)
    return namespace


def _batches(n=64):
    torch.manual_seed(0)
    x = torch.randn(n, 8)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16
    )


def _grad_norm(model):
    return torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])
    )


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_torch_export_builds_the_yaml_scaler_and_autocast_and_clips_unscaled(config):
    export = scalertune.export(config, "torch", device="cpu")
    built = export.build()
    scaler, autocast, max_norm = built["scaler"], built["autocast"], built["max_norm"]
    assert scaler.is_enabled() == (config.dtype == "float16")
    if config.uses_scaler:
        assert _knobs(scaler) == _yaml_knobs(config)
    assert autocast == (
        {"device_type": "cpu", "enabled": False}
        if config.dtype == "float32"
        else {"device_type": "cpu", "dtype": getattr(torch, config.dtype)}
    )
    assert max_norm == config.clip_norm
    # the code text builds the same objects
    from_code = _exec(export.code)
    assert from_code["scaler"].is_enabled() == scaler.is_enabled()
    if config.uses_scaler:
        assert _knobs(from_code["scaler"]) == _knobs(scaler)
    assert from_code["autocast"] == autocast and from_code["max_norm"] == max_norm
    assert "amp.yaml" not in export.code and "device = 'cpu'" in export.code

    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in _batches():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(**autocast):
            out = model(x)
            loss = nn.functional.mse_loss(out, y)
        assert out.dtype == getattr(torch, config.dtype)
        scaler.scale(loss).backward()
        if max_norm is not None:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            assert _grad_norm(model) <= max_norm * 1.0001
        scaler.step(optimizer)
        scaler.update()
    if max_norm is not None:
        assert "unscale_(optimizer)" in export.code
        assert export.code.index("unscale_") < export.code.index("clip_grad_norm_")


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_lightning_trainer_built_from_the_export_holds_the_yaml_knobs_and_trains(config):
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

    export = scalertune.export(config, "lightning", device="cpu")
    assert export.not_expressible == ()
    for kwargs in (export.build(), _exec(export.code)["trainer_kwargs"]):
        trainer = pl.Trainer(
            **kwargs,
            max_steps=3,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        plugin = trainer.precision_plugin
        assert trainer.gradient_clip_val == config.clip_norm
        assert trainer.gradient_clip_algorithm == "norm"
        if config.dtype == "float16":
            assert isinstance(plugin, pl.plugins.precision.MixedPrecision)
            assert plugin.precision == "16-mixed" and plugin.device == "cpu"
            assert _knobs(plugin.scaler) == _yaml_knobs(config)
        elif config.dtype == "bfloat16":
            assert plugin.precision == "bf16-mixed" and plugin.scaler is None
        else:
            assert plugin.precision == "32-true"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Module(), _batches())
    assert trainer.global_step == 3


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_accelerate_accelerator_takes_the_export_and_clips_in_the_loop(config):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    export = scalertune.export(config, "accelerate", device="cpu")
    assert export.not_expressible == ()
    # the attach alternative hands the loop's loss to the runtime, which checks it
    attach = export.code.index("scalertune.attach(accelerator,")
    assert "loss = amp.loss(lambda: " in export.code[attach:]
    for kwargs in (export.build(), _exec(export.code)["accelerator_kwargs"]):
        AcceleratorState._reset_state(reset_partial_state=True)  # one Accelerator per process
        accelerator = Accelerator(**kwargs)
        assert accelerator.device.type == "cpu"
        assert (
            accelerator.mixed_precision
            == {"float16": "fp16", "bfloat16": "bf16", "float32": "no"}[config.dtype]
        )
        if config.uses_scaler:
            # exactly what Accelerate hands to GradScaler on a GPU ...
            handler = accelerator.scaler_handler.to_kwargs()
            assert tuple(
                handler.get(k, d)
                for k, d in (
                    ("init_scale", 65536.0),
                    ("growth_factor", 2.0),
                    ("backoff_factor", 0.5),
                    ("growth_interval", 2000),
                )
            ) == _yaml_knobs(config)
            # ... and, as the export says, on a CPU it makes none and trains in float32
            assert accelerator.scaler is None
            assert any("on a CPU" in line for line in export.differences)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, _batches())
    for x, y in loader:
        with accelerator.autocast():
            loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        if export.clip_norm is not None:
            accelerator.clip_grad_norm_(model.parameters(), export.clip_norm)
            assert _grad_norm(model) <= export.clip_norm * 1.0001
        optimizer.step()
        optimizer.zero_grad()
        assert torch.isfinite(loss)


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_transformers_export_puts_the_scaler_into_the_trainer_with_attach(config, tmp_path):
    from transformers import Trainer, TrainingArguments

    export = scalertune.export(config, "transformers", device="cpu")
    for fields in (export.build(), _exec(export.code)["training_arguments"]):
        args = TrainingArguments(output_dir=str(tmp_path), **fields)
        assert (args.fp16, args.bf16) == (config.dtype == "float16", config.dtype == "bfloat16")
        # 0 is "no clipping": left out, the Trainer would clip at 1.0
        assert args.max_grad_norm == (config.clip_norm or 0.0)
        assert args.use_cpu
    assert TrainingArguments(output_dir=str(tmp_path)).max_grad_norm == 1.0
    # what TrainingArguments cannot say, the attach line the code shows puts in: every knob
    assert export.not_expressible == ()
    scalertune.export(config, "transformers", strict=True)
    line = next(c for c in export.code.splitlines() if "scalertune.attach(trainer," in c)
    trainer = Trainer(
        model=nn.Linear(8, 1),
        args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[]),
    )
    amp = eval(
        line.lstrip("# ").split("=", 1)[1].split("  #")[0],  # noqa: S307 - our own code
        {"scalertune": scalertune, "trainer": trainer},
    )
    assert amp.config == config
    if config.uses_scaler:
        assert _knobs(amp.scaler) == _yaml_knobs(config)
    assert trainer.args.max_grad_norm == (config.clip_norm or 0.0)


def test_export_best_amp_takes_the_amp_config_that_held_where_float32_won(tmp_path):
    path = tmp_path / "cpu.yaml"
    path.write_text(
        "config: {dtype: float32}\nevidence:\n  best_amp:\n    config: "
        "{dtype: float16, init_scale: 256.0, growth_interval: 50}\n"
        "    min_scale: 0.5\n"
    )
    answer = scalertune.export(str(path), "deepspeed", micro_batch_size=2)
    best = scalertune.export(str(path), "deepspeed", micro_batch_size=2, best_amp=True)
    assert answer.build()["fp16"] == {"enabled": False}
    assert best.build()["fp16"]["initial_scale_power"] == 8
    assert any("backed the scale off to 0.5" in line for line in best.not_expressible)
    ran = run_cli("export", "cpu.yaml", "--to", "transformers", "--best-amp", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "'fp16': True" in ran.stdout
    assert "scalertune.attach(trainer, 'cpu.yaml', best_amp=True)" in ran.stdout
    (tmp_path / "no.yaml").write_text("config: {dtype: float32}\n")
    missing = run_cli("export", "no.yaml", "--to", "torch", "--best-amp", cwd=tmp_path)
    assert missing.returncode == 2 and "has no evidence.best_amp" in missing.stderr


def _deepspeed_config(data):
    from deepspeed.runtime.config import DeepSpeedConfig

    return DeepSpeedConfig(data)


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_deepspeed_parses_the_exported_json_with_the_yaml_knobs(config):
    export = scalertune.export(config, "deepspeed", micro_batch_size=4)
    data = json.loads(export.code)  # real JSON, ready to save as ds_config.json
    assert data == export.build()
    parsed = _deepspeed_config(data)
    fp16, bf16 = parsed.float16_config, parsed.bfloat16_config
    assert parsed.train_micro_batch_size_per_gpu == 4
    assert parsed.gradient_clipping == (config.clip_norm or 0.0)
    assert (fp16.enabled, bf16.enabled) == (config.dtype == "float16", config.dtype == "bfloat16")
    if config.uses_scaler:
        args = fp16.dynamic_loss_scale_args()
        assert fp16.loss_scale == 0  # dynamic
        assert args["init_scale"] == 2 ** round(
            max(0, torch.log2(torch.tensor(config.init_scale)).item())
        )
        assert args["scale_window"] == config.growth_interval
        assert args["delayed_shift"] == 1 and args["min_scale"] == 1
    marked = " ".join(export.not_expressible)
    assert ("init_scale" in marked) == (
        config.uses_scaler and config.init_scale not in (65536.0, 4096.0)
    )
    assert ("growth_factor" in marked) == (config.uses_scaler and config.growth_factor != 2)
    assert ("backoff_factor" in marked) == (config.uses_scaler and config.backoff_factor != 0.5)


def test_deepspeed_clips_at_one_and_wants_a_batch_size_unless_told():
    assert _deepspeed_config({"train_micro_batch_size_per_gpu": 1}).gradient_clipping == 1.0
    export = scalertune.export(AmpConfig(dtype="bfloat16"), "deepspeed")
    assert export.build()["gradient_clipping"] == 0.0
    with pytest.raises(AssertionError, match="train_micro_batch_size_per_gpu"):
        _deepspeed_config(export.build())
    assert any("train_micro_batch_size_per_gpu" in line for line in export.comments())
    users = {"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "Adam"}}
    assert _deepspeed_config({**users, **export.build()}).bfloat16_config.enabled


def _gradscaler_scales(config, overflows):
    """The scale after each step of a real GradScaler, given which steps overflow."""
    weight = nn.Parameter(torch.zeros(()))
    optimizer = torch.optim.SGD([weight], lr=0.0)
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=config.init_scale, growth_interval=config.growth_interval
    )
    scaler.scale(torch.ones(()))
    scales = []
    for overflow in overflows:
        weight.grad = torch.full((), float("inf") if overflow else 1.0)
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def _deepspeed_scales(data, overflows, monkeypatch):
    """The scale after each step of DeepSpeed's own scalers, built from the parsed config:
    ZeRO's DynamicLossScaler, and the update of its FP16_Optimizer without ZeRO."""
    import deepspeed.comm
    from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler, LossScaleConfig

    # One process needs no communication backend: the scaler asks for the rank only to
    # decide who logs the overflow.
    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda group=None: 0)
    fp16 = _deepspeed_config(data).float16_config
    zero = CreateLossScaler(
        torch.half, fp16.loss_scale, fp16.loss_scale == 0, fp16.dynamic_loss_scale_args()
    )
    plain = type(
        "Holder",
        (),
        {
            "verbose": False,
            "loss_scale_config": LossScaleConfig(
                torch.half, fp16.loss_scale == 0, fp16.loss_scale, fp16.dynamic_loss_scale_args()
            ),
        },
    )()
    plain_scales = []
    for overflow in overflows:
        FP16_Optimizer._update_scale(plain, overflow)
        plain_scales.append(plain.loss_scale_config.cur_scale)
    zero_scales = []
    for overflow in overflows:
        try:
            zero.update_scale(overflow)
        except Exception as exc:  # DeepSpeed raises a bare Exception at the minimum
            zero_scales.append(str(exc))
            break
        zero_scales.append(zero.cur_scale)
    return zero_scales, plain_scales


def test_deepspeed_differences_from_gradscaler_are_what_the_export_says(monkeypatch):
    config = AmpConfig(init_scale=8.0, growth_interval=4)
    export = scalertune.export(config, "deepspeed", micro_batch_size=1)
    data = export.build()
    growth, minimum = export.differences[:2]

    clean = [False] * 9
    torch_scales = _gradscaler_scales(config, clean)
    zero, plain = _deepspeed_scales(data, clean, monkeypatch)

    def grew(scales):  # the steps after which the scale grew (scales[0]: the initial one)
        return [i for i in range(1, len(scales)) if scales[i] > scales[i - 1]]

    assert grew([8.0, *torch_scales]) == [4, 8]  # GradScaler: after 4 clean steps, then 8
    assert grew([8.0, *zero]) == grew([8.0, *plain]) == [5, 9]  # DeepSpeed: one step later
    assert "loss_scale_window+1 = 5 clean steps" in growth and "then every 4" in growth
    assert "1 step later" in growth

    overflows = [True] * 6
    torch_scales = _gradscaler_scales(config, overflows)
    zero, plain = _deepspeed_scales(data, overflows, monkeypatch)
    assert torch_scales == [4.0, 2.0, 1.0, 0.5, 0.25, 0.125]  # GradScaler keeps backing off
    assert plain == [4.0, 2.0, 1.0, 1, 1, 1]  # without ZeRO: stays at the minimum
    assert zero[:3] == [4.0, 2.0, 1.0] and "minimum" in zero[3]  # ZeRO: the 4th ends the run
    assert "min_loss_scale=1" in minimum and "from 2**3 that is 4 overflows in a row" in minimum


def test_deepspeed_checks_the_searched_scale_range_against_its_minimum(tmp_path):
    evidence = (
        "config:\n  dtype: float16\n  init_scale: 4096.0\n"
        "evidence:\n  min_scale: {low}\n  confirmation:\n    seed 1: {{min_scale: 64.0}}\n"
    )
    dipped, stayed = tmp_path / "dipped.yaml", tmp_path / "stayed.yaml"
    dipped.write_text(evidence.format(low=0.25))
    stayed.write_text(evidence.format(low=128.0))
    lost = scalertune.export(str(dipped), "deepspeed").not_expressible
    assert len(lost) == 1 and "backed the scale off to 0.25" in lost[0]
    with pytest.raises(scalertune.UsageError, match="deepspeed cannot express"):
        scalertune.export(str(dipped), "deepspeed", strict=True)
    kept = scalertune.export(str(stayed), "deepspeed", strict=True)
    assert "stayed at or above 64" in kept.differences[1]


def test_float32_islands_go_with_every_autocast_export_but_not_deepspeed():
    config = AmpConfig(dtype="float16", init_scale=4096.0, fp32_modules=("0",))
    for framework in ("torch", "lightning", "accelerate", "transformers"):
        export = scalertune.export(config, framework, device="cpu")
        for model in (
            export.prepare(nn.Sequential(nn.Linear(4, 4))),
            _exec(export.code, model=nn.Sequential(nn.Linear(4, 4)))["model"],
        ):
            assert is_island(model[0])
    with pytest.raises(scalertune.UsageError, match="fp32_modules"):
        scalertune.export(config, "deepspeed", strict=True)


def test_the_device_comes_from_the_user_or_auto():
    assert "device = 'cuda'" in scalertune.export(FLOAT16, "lightning", device="cuda:1").code
    auto = scalertune.export(FLOAT16, "torch")
    assert 'device = "cuda" if torch.cuda.is_available() else "cpu"' in auto.code
    assert auto.device == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(scalertune.UsageError, match="unknown device"):
        scalertune.export(FLOAT16, "torch", device="tpu")


def test_export_command_prints_json_for_deepspeed_and_strict_refuses_in_one_line(tmp_path):
    path = tmp_path / "odd.yaml"
    path.write_text(
        "config:\n" + "".join(f"  {k}: {v}\n" for k, v in ODD.to_dict().items() if v is not None)
    )
    ds = run_cli("export", "odd.yaml", "--to", "deepspeed", "--micro-batch-size", "2", cwd=tmp_path)
    assert ds.returncode == 0, ds.stderr
    data = json.loads(ds.stdout)
    assert data["fp16"]["min_loss_scale"] == 1 and data["gradient_clipping"] == 0.0
    assert _deepspeed_config(data).float16_config.initial_scale_power == 0
    assert "NOT EXPRESSIBLE: init_scale=0.125" in ds.stderr and "DIFFERS: growth" in ds.stderr
    for framework, quiet in (("deepspeed", ["-q"]),):
        # -q drops the notes, never the error
        strict = run_cli(*quiet, "export", "odd.yaml", "--to", framework, "--strict", cwd=tmp_path)
        assert strict.returncode == 2 and f"{framework} cannot express" in strict.stderr
        assert len(strict.stderr.strip().splitlines()) == 1 and strict.stdout == ""
    lightning = run_cli(
        "export", str(path), "--to", "lightning", "--strict", "--device", "cpu", cwd=tmp_path
    )
    assert lightning.returncode == 0, lightning.stderr
    code = [line for line in lightning.stdout.splitlines() if not line.startswith("#")]
    assert not any(str(path) in line for line in code)  # the code stands alone: no file read
    assert f"scalertune.attach(trainer, {str(path)!r})" in lightning.stdout  # the one that does
    scaler = _exec(lightning.stdout)["trainer_kwargs"]["plugins"][0].scaler
    assert _knobs(scaler) == _yaml_knobs(ODD)


def test_guard_stops_a_run_whose_forward_overflows_and_says_why():
    parts = example("attention").make_model()
    amp = AmpRuntime(AmpConfig(), device="cpu", guard=Guard())
    with pytest.raises(AmpGuardError, match="overflows float16 in the forward pass") as caught:
        for _ in range(10):
            for batch in parts["batches"]:
                amp.train_step(parts["model"], parts["optimizer"], parts["loss_fn"], batch)
    assert "scalertune diagnose" in str(caught.value)
    assert amp.steps <= 60
    # unchecked, the guard has not looked at the forward: it names both causes it cannot
    # tell apart (a burst of huge losses overflows the gradients alone), and what would
    said = str(caught.value)
    assert "Either an activation overflows" in said and "too large for float16" in said
    assert "the in-run check (check='act', the default) tells the two apart" in said


def test_guard_stays_quiet_on_healthy_training():
    import workloads

    parts = workloads.healthy()
    amp = AmpRuntime(AmpConfig(), device="cpu", guard=Guard())
    for _ in range(25):
        for batch in parts["batches"]:
            amp.train_step(parts["model"], parts["optimizer"], parts["loss_fn"], batch)
    assert amp.steps == 100


# --- lightning_workload: a LightningModule searched through its own training_step ---


def _scheduled_module():
    import lightning.pytorch as pl

    class Scheduled(pl.LightningModule):
        """Reads what modules commonly read from the Trainer, and steps three schedulers."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Linear(8, 1)
            self.seen = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.seen.append(
                (
                    self.global_step,
                    self.current_epoch,
                    batch_idx,
                    self.optimizers().param_groups[0]["lr"],
                    self.trainer.is_global_zero,
                    self.trainer.max_steps,
                )
            )
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
            self.total = self.trainer.estimated_stepping_batches
            return [optimizer], [
                {
                    "scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5),
                    "interval": "step",
                    "frequency": 2,
                },
                torch.optim.lr_scheduler.MultiplicativeLR(optimizer, lambda epoch: 0.1),
                {
                    "scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(
                        optimizer, mode="max", factor=0.9, patience=0
                    ),
                    "monitor": "train_loss",
                    "interval": "step",
                },
            ]

    return Scheduled()


def _loader():
    torch.manual_seed(1)
    x = torch.randn(48, 8)
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16
    )


def test_lightning_workload_steps_schedulers_and_counters_as_a_lightning_trainer_does():
    import lightning.pytorch as pl

    steps = 8  # two full epochs of 3 batches and part of a third
    reference = _scheduled_module()
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(reference, _loader())

    module = _scheduled_module()
    workload = scalertune.lightning_workload(module, _loader(), max_steps=steps)
    amp = AmpRuntime(AmpConfig(dtype="float32"), device="cpu")
    batches = iter(_loader())
    for i in range(steps):
        if i % 3 == 0:
            batches = iter(_loader())
        workload.step(workload.model, [next(batches)], amp)  # one optimizer step's batches
    assert module.total == reference.total == steps
    assert [s[:3] for s in module.seen] == [s[:3] for s in reference.seen]
    assert [s[3] for s in module.seen] == pytest.approx([s[3] for s in reference.seen])
    assert all(s[4:] == (True, steps) for s in module.seen)


def _reads_the_fit_loop():
    import lightning.pytorch as pl

    class ReadsFitLoop(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.trainer.fit_loop.epoch_loop  # noqa: B018 - what the module reads
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return scalertune.lightning_workload(ReadsFitLoop(), list(_loader()))


def _manual_optimization():
    module = _scheduled_module()
    module.automatic_optimization = False
    return scalertune.lightning_workload(module, list(_loader()))


def test_lightning_workload_names_what_it_cannot_offer(storage):
    with pytest.raises(scalertune.UsageError, match=r"self\.trainer\.fit_loop: lightning_work"):
        scalertune.search(_reads_the_fit_loop, storage=storage, n_trials=0, steps=20, device="cpu")
    with pytest.raises(scalertune.UsageError, match="automatic_optimization = False"):
        scalertune.search(_manual_optimization, storage=storage, device="cpu")
    with pytest.raises(scalertune.UsageError, match="needs a LightningModule"):
        scalertune.lightning_workload(nn.Linear(2, 2), [])


def test_search_takes_a_function_and_isolation_wants_one_it_can_import(storage):
    with pytest.raises(scalertune.UsageError, match="--isolate .* cannot import the factory"):
        scalertune.search(
            lambda: None, storage=storage, device="cpu", isolation=scalertune.Isolation()
        )
    import workloads

    from scalertune._workload._loader import default_study_name

    assert default_study_name(workloads.healthy) == "workloads:healthy"
    assert default_study_name(spec("healthy")) == "workloads:healthy"


def test_export_of_a_result_file_cut_short_is_one_line_exit_2(tmp_path):
    """A file ``report -o`` wrote (a real study's), cut before its evidence: export names
    what it lost in one line, exit 2, where it exported the config without a word; a cut
    mid-value, which is no longer YAML, is said to be cut too."""
    import os
    import shutil

    from conftest import HERE

    shutil.copy(os.path.join(HERE, "data", "study_v1.journal"), tmp_path / "v1.journal")
    args = ["report", "--storage", "v1.journal", "--study-name", "short", "-o", "r.yaml"]
    assert run_cli(*args, cwd=tmp_path).returncode == 0
    text = (tmp_path / "r.yaml").read_text()
    (tmp_path / "cut.yaml").write_text(text[: text.index("evidence:\n")])
    (tmp_path / "mid.yaml").write_text(text[: text.index("  verdict: ") + len("  verdict: '")])
    for name, lost in (("cut.yaml", ": it has no evidence, evidence.model: "), ("mid.yaml", "")):
        done = run_cli("export", name, "--to", "torch", cwd=tmp_path, process=True)
        assert done.returncode == 2, done.stderr
        said = done.stderr.strip()
        assert "\n" not in said and done.stdout == ""
        assert f"{name} was cut short" in said and (lost in said or not lost)


@pytest.mark.parametrize(
    "check, said",
    [
        ("{every: 0, action: act, window: 5}", "the check's every must be an integer from 1"),
        ("{every: 100, action: 'rm -rf /', window: 5}", "the check's action must be one of"),
    ],
)
def test_export_refuses_a_check_block_that_loading_the_file_would_refuse(tmp_path, check, said):
    """The exports print an attach line that loads the file: a ``check`` block that
    ``scalertune.load`` refuses is refused by export too, for the same reason, in one line,
    exit 2."""
    path = tmp_path / "amp.yaml"
    path.write_text(f"config: {{dtype: bfloat16, clip_norm: 1.0}}\ncheck: {check}\n")
    with pytest.raises(scalertune.UsageError) as loaded:
        scalertune.load(str(path), device="cpu", storage=False)
    reason = str(loaded.value).removeprefix(f"{path}: ")
    assert reason.startswith(said)
    for framework in ("torch", "lightning", "transformers", "accelerate"):
        done = run_cli("export", "amp.yaml", "--to", framework, cwd=tmp_path)
        assert done.returncode == 2 and done.stdout == "", (framework, done)
        assert done.stderr.strip() == f"scalertune export: error: amp.yaml: {reason}"


@pytest.mark.parametrize("framework", ["lightning", "transformers", "accelerate"])
def test_the_attach_line_of_a_config_export_names_the_config_by_its_own_fields(framework):
    """An export of a config (no YAML) says how to attach that config: the line's argument
    is the config again, written with the fields it has (a float16 config's line carried
    every float8 field of AmpConfig's repr)."""
    config = AmpConfig(init_scale=1024.0, growth_interval=500, clip_norm=1.0)
    code = scalertune.export(config, framework, device="cpu").code
    (line,) = [x for x in code.splitlines() if "amp = scalertune.attach(" in x]
    argument = line.split("scalertune.attach(", 1)[1].split(", ", 1)[1].rsplit(")  #", 1)[0]
    assert "float8" not in argument
    assert eval(argument, {"scalertune": scalertune}) == config  # noqa: S307 - our own line
