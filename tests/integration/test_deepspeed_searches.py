"""DeepSpeed searched in its own engine, end to end, as a user runs it: the shipped DeepSpeed
factory and a Hugging Face Trainer made with ``deepspeed=``, each searched from the command
line, the answer taken back the way DeepSpeed takes it (the exported ``ds_config.json``, or
``scalertune.attach`` under torchrun), and DeepSpeed's own count of skipped steps held
against what the search predicts for the block it trains with."""

import json
import os
import shutil
import subprocess
import sys

import deepspeed_workloads as dsw
import pytest
import yaml
from conftest import HERE, ROOT, example, run_cli, spec

import scalertune
from scalertune._judge._rank import skip_tolerance

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def test_a_deepspeed_factory_search_answers_a_block_deepspeed_trains_as_predicted(tmp_path):
    shutil.copytree(os.path.join(ROOT, "examples"), tmp_path / "examples")
    factory = "examples/deepspeed_factory.py:make_model"
    ran = run_cli(
        "search", factory, "--space", "float16", "--steps", 100, "--n-trials", 3,
        "--storage", "ds.db", "-o", "ds.yaml", "--quiet", cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    data = yaml.safe_load((tmp_path / "ds.yaml").read_text())
    evidence = data["evidence"]
    best = evidence["best_amp"]["config"]
    assert best["dtype"] == "float16" and best["fp16"]["enabled"] is True
    assert evidence["deepspeed"]["zero_stage"] == 2
    assert "Current loss scale already at minimum" in evidence["best_amp"]["guard"]
    assert evidence["deepspeed-default"]["skipped_steps"] > 0  # 2**16 overflows here
    # the summary promises no in-run check, which DeepSpeed's engine leaves out
    assert "Past step 100: a run in DeepSpeed's engine has no in-run check" in " ".join(
        ran.stdout.split()
    )
    assert "checks itself against float32" not in ran.stdout
    exported = run_cli("export", "ds.yaml", "--to", "deepspeed", "--best-amp", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    config = json.loads(exported.stdout)
    from deepspeed.runtime.config import DeepSpeedConfig

    parsed = DeepSpeedConfig(config)  # the whole ds_config.json: the factory's, answered
    assert parsed.zero_optimization_stage == 2 and parsed.float16_config.enabled
    assert config["fp16"] == best["fp16"]
    result = scalertune.analyze(
        __import__("optuna").load_study(study_name=None, storage=f"sqlite:///{tmp_path}/ds.db")
    )
    module = example("deepspeed_factory")
    for block in (config["fp16"], {"enabled": True, "initial_scale_power": 20, "hysteresis": 1}):
        _, skipped, _ = dsw.deepspeed_training(
            module.make_model, block, 100, clipping=config["gradient_clipping"]
        )
        predicted = result.predict(block).skipped_steps
        assert abs(predicted - skipped) <= skip_tolerance(skipped), (block, predicted, skipped)


ATTACH = """
import json, sys
sys.path.insert(0, {here!r})
import scalertune
import deepspeed_workloads as dsw
from scalertune._amp._config import DeepSpeedFp16Config

if __name__ == "__main__":
    # this script's own choice, as a search's processes make it: gloo's all-reduce, not
    # DeepSpeed's shared-memory one, which would be compiled first (a minute of a CPU)
    from scalertune._frameworks import _deepspeed, _deepspeed_private
    _deepspeed_private.leave_shared_memory_unbuilt()
    out = {{}}
    for name, config in (("best", {path!r}), ("high", DeepSpeedFp16Config(
            init_scale=2.0**24, hysteresis=1, growth_interval=10, clip_norm=1.0))):
        trainer = dsw.trainer(max_steps=dsw.SEARCHED_STEPS, output_dir={out!r})
        amp = scalertune.attach(trainer, config, best_amp=name == "best")
        trainer.train()
        config = _deepspeed.trainer_config(trainer)
        out[name] = {{"engine": trainer.model_wrapped.skipped_steps, "amp": amp.skipped_steps,
                     "steps": amp.steps, "fp16": config["fp16"]}}
    print(json.dumps(out))
"""


def test_a_deepspeed_trainer_search_attaches_and_trains_under_torchrun_as_predicted(tmp_path):
    ran = run_cli(
        "search", spec("make_trainer", "deepspeed_workloads.py"), "--space", "float16",
        "--steps", dsw.SEARCHED_STEPS, "--n-trials", 1, "--storage", "tr.db", "-o", "tr.yaml",
        "--quiet", cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    path = str(tmp_path / "tr.yaml")
    block = scalertune.export(path, "deepspeed", best_amp=True).build()["fp16"]
    script = tmp_path / "attach.py"
    script.write_text(ATTACH.format(here=HERE, path=path, out=str(tmp_path / "out")))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", str(script)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = json.loads(proc.stdout.strip().splitlines()[-1])
    assert trained["best"]["fp16"] == block  # DeepSpeed trained with the exported block
    result = scalertune.analyze(
        __import__("optuna").load_study(study_name=None, storage=f"sqlite:///{tmp_path}/tr.db")
    )
    high = {"enabled": True, "loss_scale": 0, "initial_scale_power": 24}
    high.update(loss_scale_window=10, hysteresis=1, consecutive_hysteresis=False, min_loss_scale=1)
    assert trained["high"]["fp16"] == high
    for name, fp16 in (("best", block), ("high", high)):
        run = trained[name]
        assert run["engine"] == run["amp"] and run["steps"] == dsw.SEARCHED_STEPS
        predicted = result.predict(fp16).skipped_steps
        assert abs(predicted - run["engine"]) <= skip_tolerance(run["engine"]), (name, run)
    assert trained["high"]["engine"] > 0


def test_a_deepspeed_run_on_two_ranks_trains_as_deepspeed_in_one_process():
    """Every rank holds the same batches here: the gradients ZeRO averages over the two are
    one process's, so the run is DeepSpeed's own training in one process, loss for loss and
    skip for skip."""
    import torch

    from scalertune._amp._config import DeepSpeedFp16Config
    from scalertune._search._launch import run_isolated

    config = DeepSpeedFp16Config(init_scale=2.0**20, hysteresis=2, growth_interval=8, clip_norm=1.0)
    record = run_isolated(
        spec("regression", "deepspeed_workloads.py"),
        config,
        steps=30,
        seed=0,
        device=torch.device("cpu"),
        timeout_s=300,
        memory_gb=None,
        ranks=2,
    )
    losses, skipped, scale = dsw.deepspeed_training(dsw.regression, config.fp16_block(), 30)
    assert len(record.skipped) == skipped > 0 and record.scales[-1] == scale
    assert record.losses == pytest.approx(losses, rel=1e-5)
