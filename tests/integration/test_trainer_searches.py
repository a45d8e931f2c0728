"""Searches of the trainers users have (Hugging Face, TRL, Lightning, Accelerate), and the
answer put back into a fresh trainer with scalertune.attach, checked against what that
trainer then really does."""

import shutil
import subprocess
import sys

import optuna
import pytest
import torch
import trainers
import yaml
from conftest import ROOT, run_cli, spec

import scalertune
from scalertune import AmpConfig
from scalertune._judge._rank import skip_tolerance
from scalertune._workload._rng import seed_everything

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

#: Knobs far from PyTorch's (see tests/unit/test_frameworks.py).
FAR = AmpConfig(init_scale=2.0**22, growth_factor=4.0, backoff_factor=0.125, growth_interval=6)


def test_a_hf_trainer_subclass_is_searched_over_its_max_steps_and_attach_skips_as_predicted(
    tmp_path,
):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    result = scalertune.search(
        trainers.scaled_loss_trainer,
        storage=storage,
        steps=20,
        space="float16",
        n_trials=3,
        device="cpu",
    )
    assert result.to_dict()["evidence"]["horizon"] == trainers.HF_STEPS  # no --horizon given
    # the search's float32 reference is the Trainer's own float32 training, loss for loss
    seed_everything(0)
    own, _ = trainers.hf_losses_and_skips(trainers.scaled_loss_trainer())
    reference = result.reference["losses"]  # the trial's steps of it
    assert len(reference) == 20 and reference == pytest.approx(own[:20], rel=1e-5)
    # a YAML with knobs far from PyTorch's, attached to a fresh Trainer made without fp16:
    # it trains in float16 on this CPU, and the steps its optimizer really skipped (a hook on
    # the torch optimizer, outside scalertune) are what the study predicts
    study = optuna.load_study(study_name=result.study_name, storage=storage)
    predicted = scalertune.analyze(study).predict(FAR)
    fresh = trainers.scaled_loss_trainer()
    amp = scalertune.attach(fresh, FAR, check=False)  # its float32 forward is tested on its own
    dtypes = []
    fresh.model.lm_head.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    _, skipped = trainers.hf_losses_and_skips(fresh)
    assert set(dtypes) == {torch.float16} and len(dtypes) == 2 * trainers.HF_STEPS
    assert predicted.horizon == trainers.HF_STEPS and len(skipped) > 3
    assert abs(predicted.skipped_steps - len(skipped)) <= skip_tolerance(len(skipped))
    assert amp.skipped_steps == len(skipped)


def test_a_trl_sft_trainer_is_searched_as_it_trains(tmp_path):
    seed_everything(0)
    own, _ = trainers.hf_losses_and_skips(trainers.sft_trainer())
    ran = run_cli(
        "search",
        spec("sft_trainer", "trainers.py"),
        "--steps",
        "20",
        "--n-trials",
        "2",
        "--space",
        "bfloat16",
        "--device",
        "cpu",
        "-o",
        "sft.yaml",
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    assert "horizon 24 steps" in ran.stdout
    result = scalertune.analyze(
        optuna.load_study(
            study_name="trainers:sft_trainer", storage=f"sqlite:///{tmp_path / 'scalertune.db'}"
        )
    )
    # within float rounding: the search clips with torch's clip_grad_norm_, TRL's Trainer with
    # Accelerate's, which sums the same squares in another order
    reference = result.reference["losses"]
    assert len(reference) == 20 and reference == pytest.approx(own[:20], rel=1e-4)


def test_a_lightning_trainer_and_an_accelerator_are_searched_from_the_command_line(tmp_path):
    for name, horizon in (("lightning_parts", trainers.LIGHTNING_STEPS), ("accelerate_parts", 40)):
        ran = run_cli(
            "search",
            spec(name, "trainers.py"),
            "--steps",
            "20",
            "--n-trials",
            "2",
            "--space",
            "float16",
            "--device",
            "cpu",
            "-o",
            f"{name}.yaml",
            cwd=tmp_path,
        )
        assert ran.returncode == 0, ran.stderr
        evidence = yaml.safe_load((tmp_path / f"{name}.yaml").read_text())["evidence"]
        assert evidence["horizon"] == horizon
        assert evidence["pytorch-default"]["skipped_steps"] > 0  # the summed loss overflows


@pytest.mark.parametrize(
    "name, factory, horizon",
    [("hf_trainer", "make_trainer", 60), ("lightning_trainer", "make_trainer", 120)],
)
def test_the_shipped_trainer_examples_search_and_attach(tmp_path, name, factory, horizon):
    shutil.copytree(f"{ROOT}/examples", tmp_path / "examples")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalertune",
            "search",
            f"examples/{name}.py:{factory}",
            "--steps",
            "30",
            "--horizon",
            str(horizon),
            "--n-trials",
            "4",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / f"{name}_{factory}.yaml"
    data = yaml.safe_load(path.read_text())
    assert data["evidence"]["horizon"] == horizon and "Recommended:" in proc.stdout
    sys.path.insert(0, str(tmp_path / "examples"))
    try:
        module = __import__(name)
    finally:
        sys.path.pop(0)
    made = getattr(module, factory)()
    trainer = made["trainer"] if isinstance(made, dict) else made
    best_amp = "best_amp" in data["evidence"]
    amp = scalertune.attach(trainer, str(path), best_amp=best_amp)
    if isinstance(made, dict):
        trainer.fit_loop.epoch_loop.max_steps = 10
        trainer.fit(made["model"], made["batches"])
        assert trainer.global_step == 10
    else:
        trainer.args.max_steps = 10
        out = trainer.train()
        assert torch.isfinite(torch.tensor(out.training_loss))
    assert amp.config == scalertune.load_config(str(path), best_amp=best_amp)
    assert amp.steps == 10
