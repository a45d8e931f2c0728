"""The in-run check wherever the answer goes: a Lightning Trainer fitting the late precision
floor ends within 1.10x of Lightning's own float32 fit; a Hugging Face Trainer and an
Accelerate loop check themselves through the loss they already compute (and a check that
finds nothing leaves the Trainer's training as it was, loss for loss); 2 DDP ranks under
torchrun take the same action at the same step and end within 1.10x of float32 on ranks."""

import json
import os
import shutil
import subprocess
import sys
import warnings

import late_workloads
import pytest
import torch
import trainers
from torch import nn

import scalertune
from scalertune import AmpCheckWarning, AmpConfig
from scalertune._amp._schema import write_result

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3000


def _yaml(tmp_path, config, check=None):
    path = str(tmp_path / "amp.yaml")
    data = {"config": config.to_dict(), "evidence": {}}
    if check:
        data["check"] = check
    write_result(data, path)
    return path


def _quiet_trainer(steps):
    """A Lightning Trainer of ``steps`` steps on the CPU that logs and saves nothing itself."""
    import lightning.pytorch as pl

    return pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def _lightning_fit(attach_to=None, steps=STEPS, check=None):
    """readings_near_1000 as a LightningModule, fit ``steps`` steps by Lightning's own loop;
    the mean of the last 100 logged losses, and how many times ``self.log`` was called."""
    import lightning.pytorch as pl

    torch.manual_seed(0)
    w = late_workloads.readings_near_1000()
    logged, losses = [], []

    class Readings(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = w["model"]

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = w["loss_fn"](self.net(x), y)
            self.log("loss", loss)
            return loss

        def log(self, *args, **kwargs):
            logged.append(args[0])
            return super().log(*args, **kwargs)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"]))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.05)

    trainer = _quiet_trainer(steps)
    amp = scalertune.attach(trainer, attach_to, check=check) if attach_to else None
    loader = torch.utils.data.DataLoader(w["batches"], batch_size=None, shuffle=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Readings(), loader)
    lines = [str(m.message) for m in caught if issubclass(m.category, AmpCheckWarning)]
    return sum(losses[-100:]) / 100, len(logged), lines, amp


def test_a_lightning_fit_checks_itself_and_ends_within_1_10x_of_float32(tmp_path):
    float32, _, _, _ = _lightning_fit()
    # the same config trained as it is ends at 5x float32's loss: the loop's test shows it
    checked, calls, lines, amp = _lightning_fit(_yaml(tmp_path, AmpConfig(dtype="bfloat16")))
    assert checked <= 1.10 * float32, (checked / float32, lines)
    assert lines and "training in float32 from now on" in lines[-1]
    assert calls == STEPS  # the check's passes log nothing: one self.log per step
    assert amp.steps == STEPS and amp.config.dtype == "float32"


def _floor_trainer(amp_yaml, **overrides):
    """A Hugging Face Trainer of a model whose bfloat16 output near 1000 rounds by 4 (its
    float32 island on the output layer closes the gap), learning nothing (lr 0)."""
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)

    class Readings(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
            with torch.no_grad():
                self.net[2].bias.fill_(1000.0)

        def forward(self, x, labels=None):
            out = self.net(x)
            return {"loss": nn.functional.mse_loss(out, labels), "logits": out}

    model = Readings()
    x = torch.randn(64, 4)
    with torch.no_grad():
        y = model.net(x) + 0.01 * torch.randn(64, 1)
    data = [{"x": x[i], "labels": y[i]} for i in range(64)]
    callbacks = overrides.pop("callbacks", None)
    args = TrainingArguments(
        output_dir=str(overrides.pop("out")),
        per_device_train_batch_size=64,
        learning_rate=0.0,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
        **{"max_steps": 6, "save_strategy": "no", **overrides},
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
    return trainer, scalertune.attach(trainer, amp_yaml)


def test_a_hugging_face_trainer_checks_itself_through_its_compute_loss(tmp_path):
    path = _yaml(tmp_path, AmpConfig(dtype="bfloat16"), {"every": 1, "window": 3})
    trainer, amp = _floor_trainer(path, out=tmp_path / "hf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    (line,) = [str(m.message) for m in caught if issubclass(m.category, AmpCheckWarning)]
    assert "scalertune check at step 2: bfloat16's loss is" in line
    assert "keeping 'net.2' in float32" in line
    assert amp.config.fp32_modules == ("net.2",) and len(amp.check.checks) == 6


def test_a_hugging_face_trainer_resumed_from_its_checkpoint_keeps_what_the_check_did(tmp_path):
    """The check keeps 'net.2' in float32 at step 2; the Trainer saves at step 3. A new
    Trainer, attached to the same YAML, resumed from that checkpoint trains on with the
    island from its first step, says nothing again, and its check's record goes on from
    step 3, as the run never stopped does."""
    path = _yaml(tmp_path, AmpConfig(dtype="bfloat16"), {"every": 1, "window": 3})
    saving = {"save_strategy": "steps", "save_steps": 3}
    whole, whole_amp = _floor_trainer(path, out=tmp_path / "whole", **saving)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole.train()
    from transformers import TrainerCallback

    class Backup(TrainerCallback):  # a user's own: copies each checkpoint away as it is saved
        def on_save(self, args, state, control, **kwargs):
            name = f"checkpoint-{state.global_step}"
            shutil.copytree(os.path.join(args.output_dir, name), tmp_path / "backup" / name)

    first, _ = _floor_trainer(
        path, out=tmp_path / "hf", **saving, max_steps=3, callbacks=[Backup()]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first.train()
    assert (tmp_path / "hf" / "checkpoint-3" / "scalertune_amp.pt").is_file()
    # the runtime's state is written before a user's on_save sees the checkpoint
    assert (tmp_path / "backup" / "checkpoint-3" / "scalertune_amp.pt").is_file()
    resumed, amp = _floor_trainer(path, out=tmp_path / "hf", **saving)
    assert amp.config.fp32_modules == ()  # the YAML's config, until the state comes back
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.train(resume_from_checkpoint=True)
    assert not [m for m in caught if issubclass(m.category, AmpCheckWarning)]
    assert amp.config.fp32_modules == whole_amp.config.fp32_modules == ("net.2",)
    assert [c.step for c in amp.check.checks] == [c.step for c in whole_amp.check.checks]
    assert amp.steps == whole_amp.steps == 6
    # a checkpoint without the runtime's state: said in one line, the run resumes as attached
    (tmp_path / "hf" / "checkpoint-3" / "scalertune_amp.pt").unlink()
    again, amp = _floor_trainer(path, out=tmp_path / "hf", **saving)
    with pytest.warns(UserWarning, match="holds no scalertune_amp.pt"):
        again.train(resume_from_checkpoint=str(tmp_path / "hf" / "checkpoint-3"))


def _floor_fit(amp_yaml, steps, ckpt_path=None, save_to=None):
    """The floor model of :func:`_floor_trainer` fit by Lightning's own loop to ``steps``
    (from ``ckpt_path`` when given; its checkpoint saved to ``save_to``); the runtime and the
    check's lines."""
    import lightning.pytorch as pl

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    with torch.no_grad():
        net[2].bias.fill_(1000.0)
        x = torch.randn(64, 4)
        y = net(x) + 0.01 * torch.randn(64, 1)

    class Floor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    trainer = _quiet_trainer(steps)
    amp = scalertune.attach(trainer, amp_yaml)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = torch.utils.data.DataLoader([(x, y)] * steps, batch_size=None)
        trainer.fit(Floor(), loader, ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    checks = [str(m.message) for m in caught if issubclass(m.category, AmpCheckWarning)]
    return amp, checks, [str(m.message) for m in caught]


def test_a_lightning_fit_resumed_from_its_checkpoint_keeps_what_the_check_did(tmp_path):
    """Lightning keeps the precision plugin's state in its checkpoints: the runtime's. The
    check keeps 'net.2' in float32 at step 2; a fit resumed from the checkpoint of step 3
    trains on with the island from its first step, silent, its record going on as the run
    never stopped does."""
    path = _yaml(tmp_path, AmpConfig(dtype="bfloat16"), {"every": 1, "window": 3})
    whole, said, _ = _floor_fit(path, 6)
    assert len(said) == 1 and "keeping 'net.2' in float32" in said[0], said
    ckpt = str(tmp_path / "step3.ckpt")
    _floor_fit(path, 3, save_to=ckpt)
    amp, said, everything = _floor_fit(path, 6, ckpt_path=ckpt)
    assert said == [] and not [m for m in everything if "holds no runtime state" in m]
    assert amp.config.fp32_modules == whole.config.fp32_modules == ("net.2",)
    assert [c.step for c in amp.check.checks] == [c.step for c in whole.check.checks]
    assert amp.steps == whole.steps == 6
    # a checkpoint saved without scalertune attached: said in one line, as for a Trainer
    plain = torch.load(ckpt, weights_only=False)
    plain = {k: v for k, v in plain.items() if "RuntimePrecision" not in k}
    torch.save(plain, tmp_path / "plain.ckpt")
    _, _, said = _floor_fit(path, 6, ckpt_path=str(tmp_path / "plain.ckpt"))
    assert [m for m in said if "this Lightning checkpoint holds no runtime state" in m], said
    # a state that is not scalertune's: one line naming the entry to drop
    key = next(k for k in torch.load(ckpt, weights_only=False) if "RuntimePrecision" in k)
    torch.save({**torch.load(ckpt, weights_only=False), key: {"scaler": "garbage"}}, ckpt)
    with pytest.raises(scalertune.UsageError, match="cannot restore the runtime's state from"):
        _floor_fit(path, 6, ckpt_path=ckpt)


def test_a_check_that_finds_nothing_leaves_a_trainers_training_as_it_was(tmp_path):
    """GPT-2 with dropout, gradient accumulation and clipping: checked every 4 steps, the
    Trainer's losses are the unchecked Trainer's, step for step."""
    runs = []
    for check in ({"every": 10**9}, {"every": 4}):
        torch.manual_seed(0)
        trainer = trainers.hf_trainer(output_dir=str(tmp_path / "gpt2"))
        amp = scalertune.attach(trainer, _yaml(tmp_path, AmpConfig(dtype="bfloat16"), check))
        runs.append((trainers.hf_losses_and_skips(trainer)[0], amp))
    (plain, _), (checked, amp) = runs
    assert checked == plain
    assert [c.step for c in amp.check.checks] == list(range(0, trainers.HF_STEPS, 4))
    assert not amp.check.actions.done


def test_an_accelerate_loop_hands_its_loss_to_the_runtime(tmp_path):
    from accelerate import Accelerator

    path = _yaml(tmp_path, AmpConfig(dtype="bfloat16"), {"every": 1, "window": 3})
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    with torch.no_grad():
        model[2].bias.fill_(1000.0)
    x = torch.randn(64, 4)
    with torch.no_grad():
        y = model(x) + 0.01 * torch.randn(64, 1)
    accelerator = Accelerator(cpu=True)
    amp = scalertune.attach(accelerator, path)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            optimizer.zero_grad()
            loss = amp.loss(lambda: nn.functional.mse_loss(model(x), y))
            accelerator.backward(loss)
            optimizer.step()
    (line,) = [str(m.message) for m in caught if issubclass(m.category, AmpCheckWarning)]
    assert "keeping '2' in float32" in line and amp.config.fp32_modules == ("2",)
    assert amp.steps == 4
    # Accelerate's save_state/load_state keep the runtime's state in a file of its own, read
    # weights_only (no registered object: Accelerate unpickles those unrestricted)
    accelerator.save_state(str(tmp_path / "state"))
    assert (tmp_path / "state" / "scalertune_amp.pt").is_file()
    assert not list((tmp_path / "state").glob("custom_checkpoint_*"))
    again = Accelerator(cpu=True)
    resumed = scalertune.attach(again, path)
    again.prepare(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1)))
    again.load_state(str(tmp_path / "state"))
    assert resumed.config.fp32_modules == ("2",) and resumed.steps == 4


def test_an_accelerate_checkpoint_saved_before_attach_resumes_attached_with_one_line(tmp_path):
    """The run a user resumes with the search's answer was saved without scalertune: its
    load_state goes on, in the attached config, and says the state was not in the folder."""
    from accelerate import Accelerator

    def prepared(accelerator):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
        return accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))

    before = Accelerator(cpu=True)
    model, _ = prepared(before)
    with torch.no_grad():
        model[0].weight.add_(1.0)  # the saved run's own weights, restored below
    before.save_state(str(tmp_path / "state"))
    accelerator = Accelerator(cpu=True)
    amp = scalertune.attach(accelerator, _yaml(tmp_path, AmpConfig(dtype="bfloat16"), {}))
    resumed, _ = prepared(accelerator)
    with pytest.warns(UserWarning, match="holds no scalertune_amp.pt") as caught:
        accelerator.load_state(str(tmp_path / "state"))
    assert len(caught) == 1 and caught[0].filename == __file__
    assert torch.equal(resumed[0].weight, model[0].weight)
    assert amp.config.dtype == "bfloat16" and amp.steps == 0


@pytest.fixture(scope="module")
def on_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ranks")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + [os.path.join(HERE, "inrun_ranks.py"), str(out), str(STEPS)],
        timeout=600,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, f"torchrun exited {done.returncode}:\n{done.stderr[-4000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.xdist_group("inrun-ranks")  # one torchrun launch for both
def test_ranks_take_the_same_action_at_the_same_step(on_ranks):
    zero, one = on_ranks
    actions = zero["bfloat16"]["actions"]
    assert actions and actions == one["bfloat16"]["actions"]
    assert actions[-1]["kind"] == "float32"
    lines = [a["line"] for a in actions]
    assert zero["bfloat16"]["lines"] == one["bfloat16"]["lines"] == lines
    assert zero["bfloat16"]["loss"] <= 1.10 * zero["float32"]["loss"]


@pytest.mark.xdist_group("inrun-ranks")  # one torchrun launch for both
def test_ranks_that_train_copies_are_named_once_and_all_reduced_ones_are_not(on_ranks):
    for rank in on_ranks:
        (line,) = rank["copies"]
        assert line.startswith("scalertune check at step 5, rank 1's weights differ from rank 0's")
        assert "or all-reduce the gradients in the step" in line
        assert rank["all_reduced"] == []
        assert not any("copy of its own" in line for line in rank["bfloat16"]["lines"])  # DDP


@pytest.mark.xdist_group("inrun-ranks")  # one torchrun launch for both
def test_fully_sharded_ranks_keep_the_same_module_in_float32(on_ranks):
    zero, one = on_ranks
    assert zero["fsdp2"] == one["fsdp2"]
    assert zero["fsdp2"]["islands"] == ["2"]
    assert [a["kind"] for a in zero["fsdp2"]["actions"]] == ["island"]
