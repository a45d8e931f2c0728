"""diagnose and float32 islands: find where float16 overflows, and keep that part in float32."""

import os
import subprocess
import sys

import pytest
import torch

import scalertune
from scalertune import AmpConfig, AmpRuntime
from scalertune._run import run_config
from conftest import ROOT, example
import workloads

ATTENTION = os.path.join(ROOT, "examples", "attention.py") + ":make_model"
CPU = torch.device("cpu")


def test_diagnose_names_the_module_whose_forward_overflows():
    d = scalertune.diagnose(ATTENTION, device="cpu")
    assert d.kind == "forward"
    assert d.first_forward_nonfinite == "attn.score"
    assert d.islands == ["attn.score"]
    assert "forward overflow in module 'attn.score'" in d.verdict
    names = [m.name for m in d.modules]
    assert names.index("attn.q") < names.index("attn.score") < names.index("head")
    score = next(m for m in d.modules if m.name == "attn.score")
    assert score.forward["float16"].nonfinite > 0
    assert score.forward["bfloat16"].nonfinite == 0


def test_gradient_overflow_is_diagnosed_as_such_with_no_island():
    d = scalertune.diagnose(workloads.gradient_overflow, device="cpu")
    assert d.kind == "gradient-overflow" and d.islands == []
    assert d.suggested_init_scale is not None and d.suggested_init_scale < 2.0**16
    assert d.grad_absmax * d.suggested_init_scale <= 65504


def test_underflow_at_scale_one_is_diagnosed_as_underflow():
    d = scalertune.diagnose(workloads.underflow, init_scale=1.0, device="cpu")
    assert d.kind == "underflow" and d.islands == []
    assert d.underflow_share > 0.9
    assert d.suggested_init_scale > 1.0
    assert scalertune.diagnose(workloads.healthy, device="cpu").kind == "clean"


def test_islands_run_in_float32_in_training_code_exactly_as_in_the_search(tmp_path):
    attention = example("attention")
    torch.manual_seed(0)
    parts = attention.make_model()
    amp = AmpRuntime(AmpConfig(fp32_modules=("attn.score",)), device="cpu")
    seen = {}

    def record_dtype(module, inputs, output):
        seen["dtype"] = output.dtype

    parts["model"].attn.score.register_forward_hook(record_dtype)
    for batch in parts["batches"][:3]:
        loss = amp.train_step(parts["model"], parts["optimizer"], parts["loss_fn"], batch)
        assert torch.isfinite(loss)
    assert seen["dtype"] == torch.float32
    assert AmpConfig.from_dict(AmpConfig(fp32_modules=("attn.score",)).to_dict()).fp32_modules == (
        "attn.score",)


def test_no_hooks_or_wrappers_are_left_on_the_model_unless_asked():
    attention = example("attention")
    record = run_config(attention.make_model, AmpConfig(dtype="bfloat16"), steps=20, seed=0,
                        device=CPU)
    assert not record.pruned
    torch.manual_seed(0)
    model = attention.make_model()["model"]
    AmpRuntime(AmpConfig(), device="cpu").prepare(model)
    assert all(not m._forward_hooks and "forward" not in vars(m) for m in model.modules())
    scalertune.diagnose(attention.make_model, steps=1, device="cpu")
    # diagnose works on its own fresh workloads and removes its hooks
    assert all(not m._forward_hooks for m in model.modules())


@pytest.mark.slow
def test_search_names_the_overflow_and_the_island_then_fixes_it(storage, tmp_path):
    overflowing = scalertune.search(ATTENTION, storage=storage, space="float16", n_trials=2,
                                    steps=60, device="cpu")
    assert overflowing.forward_overflow_modules == ["attn.score"]
    assert all(o.attrs["overflow_module"] == "attn.score" for o in overflowing.ranking)
    assert "--fp32-modules attn.score" in overflowing.summary()
    fixed = scalertune.search(ATTENTION, storage=storage, space="float16", n_trials=2,
                              steps=60, device="cpu", fp32_modules="attn.score",
                              study_name="attention+fp32")
    sampled = [o for o in fixed.ranking if o.role == "search"]
    assert sampled and not [o for o in sampled if o.prune_kind == "forward"]
    assert all(o.config.fp32_modules == ("attn.score",) for o in sampled)
    assert fixed.recommended is not None
    assert fixed.recommended.config.fp32_modules == ("attn.score",)
    fixed.to_yaml(str(tmp_path / "amp.yaml"))
    assert scalertune.load_config(str(tmp_path / "amp.yaml")).fp32_modules == ("attn.score",)


def test_diagnose_command_prints_the_table_the_verdict_and_the_next_step(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scalertune", "diagnose", ATTENTION,
                           "--device", "cpu"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "attn.score" in proc.stdout and "Verdict: forward overflow" in proc.stdout
    assert "--fp32-modules attn.score" in proc.stdout


def test_an_unknown_island_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scalertune", "search", ATTENTION,
                           "--fp32-modules", "attn.nope"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 2
    assert "fp32_modules names 'attn.nope'" in proc.stderr
    assert not (tmp_path / "scalertune.db").exists()
