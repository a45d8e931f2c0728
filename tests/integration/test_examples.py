"""The shipped examples, run as the README runs them."""

import os
import shutil
import subprocess
import sys

import torch
import yaml
from conftest import ROOT

import scalertune
from scalertune._amp._config import PYTORCH_DEFAULT


def _example(tmp_path, name):
    shutil.copytree(os.path.join(ROOT, "examples"), tmp_path / "examples")
    return subprocess.run(
        [sys.executable, "-m", "scalertune", "search", f"examples/{name}.py:make_model"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


def test_codepoints_default_search_avoids_what_pytorch_defaults_do(tmp_path):
    proc = _example(tmp_path, "codepoints")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "pytorch-default" in out and "Recommended:" in out and "Verdict:" in out
    data = yaml.safe_load((tmp_path / "codepoints_make_model.yaml").read_text())
    default = data["evidence"]["pytorch-default"]
    # float16 gradients overflow at init_scale 65536: PyTorch's defaults skip steps.
    assert default["skipped_steps"] > 0
    # the AMP config the search found (float32 is the answer on this CPU, where AMP steps
    # are slower) skips fewer steps than PyTorch's defaults
    best = data["evidence"]["best_amp"]
    config = scalertune.load_config(str(tmp_path / "codepoints_make_model.yaml"), best_amp=True)
    assert config != PYTORCH_DEFAULT and config.to_dict() == best["config"]
    assert best["skipped_steps"] < default["skipped_steps"]
    assert best["steps_to_target"] is not None

    sys.path.insert(0, str(tmp_path / "examples"))
    try:
        import codepoints
    finally:
        sys.path.pop(0)
    parts = codepoints.make_model()
    amp = scalertune.load(str(tmp_path / "codepoints_make_model.yaml"), device="cpu", best_amp=True)
    first = last = None
    for _ in range(20):
        for batch in parts["batches"]:
            loss = amp.train_step(parts["model"], parts["optimizer"], parts["loss_fn"], batch)
            assert torch.isfinite(loss)
            first = float(loss) if first is None else first
            last = float(loss)
    assert last < first


def test_classifier_trains_under_amp_and_pytorch_defaults_train_it_too(tmp_path):
    proc = _example(tmp_path, "classifier")
    assert proc.returncode == 0, proc.stderr
    data = yaml.safe_load((tmp_path / "classifier_make_model.yaml").read_text())
    default = data["evidence"]["pytorch-default"]
    # PyTorch's defaults train it: they reach the target, or are stopped only for being
    # slower than the best run, never for going non-finite.
    assert (
        default.get("steps_to_target") is not None or "slower than the best" in default["outcome"]
    ), default
    assert not default.get("skipped_steps")
    # float32 on this CPU (AMP steps are slower here); the best AMP config that held is kept
    assert data["config"]["dtype"] == "float32"
    assert data["evidence"]["best_amp"]["config"]["dtype"] in ("float16", "bfloat16")
