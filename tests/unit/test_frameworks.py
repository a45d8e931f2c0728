"""Trainers as workloads and scalertune.attach, against what each framework does on its own:
Hugging Face's Trainer.train(), Lightning's Trainer.fit(), Accelerate's prepared objects."""

import warnings

import pytest
import torch
import trainers
from torch import nn

import scalertune
from scalertune import AmpConfig
from scalertune._frameworks._deepspeed import REFUSED
from scalertune._judge._rank import skip_tolerance
from scalertune._run._loop import run_config
from scalertune._workload._factory import build_workload

CPU = torch.device("cpu")
#: Knobs far from PyTorch's: a large start that backs off hard, and grows fast and often.
FAR = AmpConfig(init_scale=2.0**22, growth_factor=4.0, backoff_factor=0.125, growth_interval=6)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def _seeded(factory):
    """The factory called as the search calls it (seed 0), for the framework's own run."""
    from scalertune._workload._rng import seed_everything

    seed_everything(0)
    return factory()


# --- Hugging Face ---------------------------------------------------------------------------


def test_the_float32_reference_of_a_hf_trainer_is_its_own_training_loss_for_loss():
    # dropout, a shuffled dataset, warm-up, clipping at 1.0, gradient accumulation over 2
    own, skipped = trainers.hf_losses_and_skips(_seeded(trainers.hf_trainer))
    workload = build_workload(trainers.hf_trainer, seed=0, device=CPU)
    assert workload.clip_norm == 1.0 and workload.horizon == trainers.HF_STEPS
    ours = run_config(
        trainers.hf_trainer,
        AmpConfig(dtype="float32", clip_norm=1.0),
        steps=trainers.HF_STEPS,
        seed=0,
        device=CPU,
    )
    assert skipped == [] and len(own) == trainers.HF_STEPS
    assert ours.losses == pytest.approx(own, rel=1e-5, abs=0)
    assert own[-1] < 0.95 * own[0]


def test_a_trial_of_a_hf_trainer_logs_saves_and_reports_nothing(tmp_path):
    heard = []

    def factory():
        trainer = trainers.hf_trainer(
            output_dir=str(tmp_path / "out"),
            save_strategy="steps",
            save_steps=1,
            logging_steps=1,
            disable_tqdm=False,
        )

        class Heard(trainers._callback_base()):
            def on_log(self, args, state, control, **kwargs):
                heard.append("log")

            def on_save(self, args, state, control, **kwargs):
                heard.append("save")

            def on_step_end(self, args, state, control, **kwargs):
                heard.append("step")

        trainer.add_callback(Heard())
        return trainer

    record = run_config(
        factory, AmpConfig(dtype="float32", clip_norm=1.0), steps=5, seed=0, device=CPU
    )
    assert len(record.losses) == 5
    assert heard == []  # no callback: no logging, saving or report_to integration ran
    out = tmp_path / "out"
    assert not out.exists() or not any(out.iterdir())  # and no checkpoint was written


def test_a_float16_run_of_a_hf_trainer_skips_the_steps_its_own_fp16_training_skips():
    # the Trainer's own float16 path (Accelerate's autocast and a plain GradScaler with the
    # same knobs, forced on this CPU) against the search's run of the same factory
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=FAR.init_scale, growth_factor=4.0, backoff_factor=0.125, growth_interval=6
    )
    own, skipped = trainers.hf_losses_and_skips(
        _seeded(trainers.scaled_loss_trainer_float16), scaler=scaler
    )
    ours = run_config(
        trainers.scaled_loss_trainer, FAR, steps=trainers.HF_STEPS, seed=0, device=CPU
    )
    from scalertune._run._record import skipped_steps

    assert len(skipped) > 3
    assert skipped_steps(ours.scales, FAR.init_scale) == skipped
    assert ours.losses == pytest.approx(own, rel=1e-3)


def test_attach_trains_a_hf_trainer_in_float16_on_a_cpu_with_the_yaml_scaler(tmp_path):
    trainer = trainers.scaled_loss_trainer()  # made without fp16: float32 on its own
    path = tmp_path / "amp.yaml"
    from scalertune._amp._schema import write_result

    write_result({"config": {**FAR.to_dict(), "clip_norm": 5e4}}, str(path))
    amp = scalertune.attach(trainer, str(path), check=False)  # every forward the training's
    dtypes = []
    trainer.model.lm_head.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    assert (
        amp.scaler.get_scale(),
        amp.scaler.get_growth_factor(),
        amp.scaler.get_backoff_factor(),
        amp.scaler.get_growth_interval(),
    ) == (FAR.init_scale, 4.0, 0.125, 6)
    assert trainer.args.max_grad_norm == 5e4
    lrs = []

    class Rates(trainers._callback_base()):
        def on_step_end(self, args, state, control, **kwargs):
            lrs.append(kwargs["lr_scheduler"].get_last_lr()[0])

    trainer.add_callback(Rates())
    _, skipped = trainers.hf_losses_and_skips(trainer)
    micro_batches = trainers.HF_STEPS * 2
    assert dtypes == [torch.float16] * micro_batches  # every forward of the output layer
    assert amp.steps == trainers.HF_STEPS and amp.skipped_steps == len(skipped) > 3
    # the schedule waits on a skipped step: its learning rate is the step before's
    assert all(lrs[i] == lrs[i - 1] for i in skipped if i > 0)


def test_attach_refuses_what_it_cannot_drive_in_one_line():
    with pytest.raises(scalertune.UsageError, match="cannot attach to a Linear"):
        scalertune.attach(nn.Linear(2, 2), AmpConfig())
    half = trainers.hf_trainer()
    half.model.half()
    with pytest.raises(scalertune.UsageError, match="float16 parameters: mixed precision keeps"):
        scalertune.attach(half, AmpConfig())
    trainer = trainers.lightning_trainer(precision="bf16-true")
    with pytest.raises(scalertune.UsageError, match="'bf16-true'.*casts the model itself"):
        scalertune.attach(trainer, AmpConfig())
    parts = trainers.accelerate_parts()
    parts["accelerator"].prepare(parts["model"])
    with pytest.raises(scalertune.UsageError, match="attach before accelerator.prepare"):
        scalertune.attach(parts["accelerator"], AmpConfig())
    # twice: the second config would silently take over from the first
    for target in (
        trainers.hf_trainer(),
        trainers.lightning_trainer(),
        trainers.accelerate_parts()["accelerator"],
    ):
        scalertune.attach(target, AmpConfig())
        with pytest.raises(scalertune.UsageError, match="attached to a runtime already"):
            scalertune.attach(target, AmpConfig(init_scale=8.0))
    with pytest.raises(scalertune.UsageError, match="best_amp=True reads evidence.best_amp"):
        scalertune.attach(trainers.hf_trainer(), AmpConfig(), best_amp=True)


@pytest.mark.slow  # imports DeepSpeed (about 20 s here)
def test_a_lightning_trainer_on_deepspeed_gets_the_one_deepspeed_refusal():
    """The line an Accelerator and a Hugging Face Trainer on DeepSpeed get, which says what
    to do instead; not the line for a strategy scalertune does not drive."""
    trainer = trainers.lightning_trainer(strategy="deepspeed")
    with pytest.raises(scalertune.UsageError) as refused:
        scalertune.attach(trainer, AmpConfig())
    assert str(refused.value) == REFUSED["trainer"].format(what="this Trainer")
    assert str(refused.value).startswith(
        "this Trainer runs DeepSpeed, whose fp16 mode has its own loss scaler: "
    )


def test_a_hf_trainer_that_cannot_train_is_refused_in_one_line():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(trainers.Sequences())

    def endless():
        trainer = trainers.hf_trainer(max_steps=-1)
        trainer.train_dataset = Stream()  # no length, and no max_steps to stop it
        return trainer

    with pytest.raises(scalertune.UsageError, match="the Trainer's dataloader: ValueError"):
        build_workload(endless, seed=0, device=CPU)


def test_a_trainer_returned_in_a_shape_the_search_cannot_take_is_refused_in_one_line():
    trained = trainers.hf_trainer(max_steps=1)
    trained.train()
    with pytest.raises(scalertune.UsageError, match="return the Trainer before train()"):
        build_workload(lambda: trained, seed=0, device=CPU)
    with pytest.raises(scalertune.UsageError, match="comes with its LightningModule and data"):
        build_workload(trainers.lightning_trainer, seed=0, device=CPU)
    with pytest.raises(scalertune.UsageError, match="'loss_fn' comes from the trainer itself"):
        build_workload(
            lambda: {"trainer": trainers.hf_trainer(), "loss_fn": len}, seed=0, device=CPU
        )


def test_a_hf_trainer_on_another_device_than_the_search_is_refused():
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA to ask for a device it lacks")
    with pytest.raises(scalertune.UsageError, match="the Trainer trains on cpu and the search"):
        build_workload(trainers.hf_trainer, seed=0, device=torch.device("meta"))


# --- Lightning ------------------------------------------------------------------------------


def test_the_float32_reference_of_a_lightning_trainer_is_its_own_fit_loss_for_loss():
    parts = _seeded(trainers.lightning_parts)
    own, skipped = trainers.lightning_losses_and_skips(
        parts["trainer"], parts["model"], parts["batches"]
    )
    workload = build_workload(trainers.lightning_parts, seed=0, device=CPU)
    assert workload.clip_norm == 1e4 and workload.horizon == trainers.LIGHTNING_STEPS
    ours = run_config(
        trainers.lightning_parts,
        AmpConfig(dtype="float32", clip_norm=1e4),
        steps=trainers.LIGHTNING_STEPS,
        seed=0,
        device=CPU,
    )
    assert skipped == [] and len(own) == trainers.LIGHTNING_STEPS
    assert ours.losses == pytest.approx(own, rel=1e-5)


def test_a_float16_run_of_a_lightning_trainer_skips_what_its_own_fit_skips():
    from lightning.pytorch.plugins.precision import MixedPrecision

    from scalertune._run._record import skipped_steps

    scaler = torch.amp.GradScaler(
        "cpu", init_scale=FAR.init_scale, growth_factor=4.0, backoff_factor=0.125, growth_interval=6
    )
    config = AmpConfig(**{**FAR.to_dict(), "clip_norm": 1e4})
    parts = _seeded(
        lambda: {
            **trainers.lightning_parts(),
            "trainer": trainers.lightning_trainer(
                plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)]
            ),
        }
    )
    own, skipped = trainers.lightning_losses_and_skips(
        parts["trainer"], parts["model"], parts["batches"]
    )
    ours = run_config(
        trainers.lightning_parts, config, steps=trainers.LIGHTNING_STEPS, seed=0, device=CPU
    )
    assert len(skipped) > 3
    assert skipped_steps(ours.scales, FAR.init_scale) == skipped
    assert ours.losses == pytest.approx(own, rel=1e-3)


def test_the_step_timing_leaves_a_schedule_as_long_as_the_training_where_it_was():
    # a OneCycleLR as long as the Trainer's 30 steps, which Lightning steps after every step:
    # the timing's 3 dtypes x 7 windows x 10 steps would run it past its end
    from scalertune._run._timing import time_dtypes

    def factory():
        parts = trainers.lightning_parts()

        def configure_optimizers():
            optimizer = torch.optim.Adam(parts["model"].parameters(), lr=1e-3)
            total = int(parts["model"].trainer.estimated_stepping_batches)
            return [optimizer], [
                {
                    "scheduler": torch.optim.lr_scheduler.OneCycleLR(
                        optimizer, max_lr=1e-2, total_steps=total
                    ),
                    "interval": "step",
                }
            ]

        parts["model"].configure_optimizers = configure_optimizers
        return parts

    workload = build_workload(factory, seed=0, device=CPU)
    times = time_dtypes(workload, ["float32", "bfloat16", "float16"], device=CPU, clip_norm=1e4)
    assert set(times.rounds) == {"float32", "bfloat16", "float16"}
    schedule = workload.schedulers[0].lr_scheduler_configs[0].scheduler
    assert schedule.last_epoch == 0 and workload.schedulers[0].global_step == 0


def test_attach_says_a_lightning_trainers_own_mixed_precision_is_replaced():
    """A Trainer given ``bf16-mixed`` (or ``16-mixed``, which Lightning turns into bfloat16 on
    a CPU, saying so) trains the config's dtype under ``attach``: one line says its own
    precision is replaced, naming what trains; a Trainer given none is told nothing."""
    import warnings

    config = AmpConfig(clip_norm=1.0)
    with pytest.warns(UserWarning, match="precision 'bf16-mixed' is replaced by") as said:
        scalertune.attach(trainers.lightning_trainer(precision="bf16-mixed"), config)
    (replaced,) = [w for w in said if "is replaced by" in str(w.message)]
    line = str(replaced.message)
    assert line.endswith(config.describe()) and "\n" not in line
    assert replaced.filename == __file__  # pointed at the user's attach line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scalertune.attach(trainers.lightning_trainer(), config)


def test_attach_trains_a_lightning_trainer_given_no_precision_in_float16_on_a_cpu():
    parts = trainers.lightning_parts()
    config = AmpConfig(**{**FAR.to_dict(), "clip_norm": 1e4})
    # every forward is the training's: the in-run check's own (float32, tested on its own)
    # would be one more
    amp = scalertune.attach(parts["trainer"], config, check=False)
    assert parts["trainer"].precision == "16-mixed"
    dtypes = []
    parts["model"].net[-1].register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    _, skipped = trainers.lightning_losses_and_skips(
        parts["trainer"], parts["model"], parts["batches"]
    )
    assert set(dtypes) == {torch.float16} and len(dtypes) == 2 * trainers.LIGHTNING_STEPS
    assert amp.steps == trainers.LIGHTNING_STEPS and amp.skipped_steps == len(skipped) > 3
    # what a plain GradScaler loop with those knobs skips, within the replay's bound (the
    # loop draws its dropout masks in another order than Lightning's fit)
    plain = _plain_lightning_loop(FAR, trainers.LIGHTNING_STEPS)
    assert abs(len(skipped) - len(plain)) <= skip_tolerance(len(plain))


def _plain_lightning_loop(config, steps):
    """The module's training_step in a hand-written float16 loop with a plain GradScaler:
    2 batches per step, each loss halved, Adam, StepLR stepped after every step."""
    from scalertune._workload._rng import seed_everything

    seed_everything(0)
    module, loader = trainers.lightning_module(), trainers.lightning_loader()
    (optimizer,), (schedule,) = module.configure_optimizers()
    schedule = schedule["scheduler"]
    scaler = torch.amp.GradScaler(
        "cpu",
        init_scale=config.init_scale,
        growth_factor=config.growth_factor,
        backoff_factor=config.backoff_factor,
        growth_interval=config.growth_interval,
    )
    skipped, batches = [], iter(())
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        for _ in range(2):
            batch = next(batches, None)
            if batch is None:
                batches = iter(loader)
                batch = next(batches)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = module.training_step(batch, 0)
            scaler.scale(loss / 2).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1e4)
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        if scaler.get_scale() < scale:
            skipped.append(step)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            schedule.step()
    return skipped


# --- Accelerate -----------------------------------------------------------------------------


def test_attach_trains_an_accelerate_loop_in_float16_on_a_cpu_and_holds_its_scheduler():
    parts = trainers.accelerate_parts()
    accelerator = parts["accelerator"]
    amp = scalertune.attach(accelerator, AmpConfig(**{**FAR.to_dict(), "clip_norm": 1e4}))
    model, optimizer, loader, schedule = accelerator.prepare(
        parts["model"], parts["optimizer"], parts["batches"], parts["schedulers"][0]
    )
    dtypes, skipped, lrs = [], [], []
    model[-1].register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    for step, (x, y) in zip(range(30), (b for _ in range(3) for b in loader)):
        out = model(x)
        assert out.dtype == torch.float32  # Accelerate's outputs come back in float32
        accelerator.backward(parts["loss_fn"](out, y))
        accelerator.clip_grad_norm_(model.parameters(), 1e4)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if optimizer.step_was_skipped:
            skipped.append(step)
        lrs.append(schedule.get_last_lr()[0])
    assert set(dtypes) == {torch.float16}
    assert amp.steps == 30 and amp.skipped_steps == len(skipped) > 3
    assert all(lrs[i] == lrs[i - 1] for i in skipped if i > 0)
