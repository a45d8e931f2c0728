"""diagnose: every verdict agrees with what real GradScaler steps do on the same workload."""

import os

import pytest
import torch
import workloads
from conftest import ROOT, example, run_cli, spec
from gradscaler import gradscaler, one_thread  # noqa: F401 - an autouse fixture
from torch import nn

import scalertune
from scalertune import AmpConfig, _policy
from scalertune._diagnose import _policy as _diagnose_policy
from scalertune._run._loop import run_config
from scalertune._workload._loader import default_study_name
from scalertune.cli import main

ATTENTION = os.path.join(ROOT, "examples", "attention.py") + ":make_model"
CPU = torch.device("cpu")


def test_forward_overflow_names_the_module_and_the_island_is_checked():
    d = scalertune.diagnose(ATTENTION, device="cpu")
    assert d.kind == "forward"
    assert d.culprits == ["attn.score"] and d.islands == ["attn.score"]
    assert "forward overflow in module 'attn.score'" in d.verdict
    names = [m.name for m in d.modules]
    assert names.index("attn.q") < names.index("attn.score") < names.index("head")
    score = next(m for m in d.modules if m.name == "attn.score")
    assert score.forward["float16"].nonfinite > 0 and score.forward["bfloat16"].nonfinite == 0
    assert d.bfloat16_finite and "bfloat16 stays finite" in d.verdict
    # GradScaler agrees: without the island every float16 loss is inf/NaN, with it none is
    skipped, finite = gradscaler(example("attention").make_model, AmpConfig())
    assert not finite and skipped == d.skipped == d.steps
    island = AmpConfig(fp32_modules=("attn.score",))
    check = next(
        c
        for c in d.checks
        if c.config.fp32_modules == ("attn.score",) and c.config.init_scale == 2.0**16
    )
    assert check.forward_finite
    assert gradscaler(example("attention").make_model, island) == (check.skipped, True)


class _OwnScores(nn.Module):
    """Computes its attention logits in its own code, then calls a child projection on them:
    the child's hook fires first and sees inf/NaN, but only received it."""

    def __init__(self):
        super().__init__()
        self.q, self.k = nn.Linear(16, 16), nn.Linear(16, 16)
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2)  # ~1e5: inf in float16
        return self.proj(torch.softmax(scores, dim=-1))


class _Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 16)
        with torch.no_grad():
            self.embed.weight.mul_(1000.0)
        self.blocks = nn.Sequential(nn.Sequential(_OwnScores()))
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.blocks(self.embed(x))).mean(dim=1)


def nested_own_code():
    torch.manual_seed(0)
    model = _Nested()
    x = torch.randn(4, 8, 4)
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "loss_fn": nn.MSELoss(),
        "batches": [(x, torch.randn(4, 1))],
    }


def test_the_culprit_is_the_module_whose_own_code_overflowed_at_any_depth():
    d = scalertune.diagnose(nested_own_code, device="cpu", steps=2)
    assert d.first_forward_nonfinite == "blocks.0.0.proj"  # the first hook to see NaN
    assert d.culprits == ["blocks.0.0"] and d.islands == ["blocks.0.0"]
    assert d.kind == "forward"
    assert gradscaler(nested_own_code, AmpConfig(), steps=2)[1] is False
    assert gradscaler(nested_own_code, AmpConfig(fp32_modules=("blocks.0.0",)), steps=2)[1]


class _ScalesInItsOwnCode(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 16), nn.Linear(16, 1)

    def forward(self, x):
        return self.down(self.up(x) * 1e5) / 1e5  # the model's own code, no submodule


def overflows_in_the_models_own_code():
    torch.manual_seed(0)
    model = _ScalesInItsOwnCode()
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "loss_fn": nn.MSELoss(),
        "batches": workloads._regression(),
    }


def test_an_overflow_in_the_models_own_code_gets_no_island_but_the_way_out():
    d = scalertune.diagnose(overflows_in_the_models_own_code, device="cpu", steps=2)
    assert d.kind == "forward" and d.culprits == [""] and d.islands == []
    assert "the model's own forward code" in d.verdict and "bfloat16 stays finite" in d.verdict
    assert gradscaler(overflows_in_the_models_own_code, AmpConfig(), steps=2)[1] is False


def summed_in_float16():
    """A loss computed in float16 (CPU autocast keeps pow and sum in their input dtype) that
    is beyond 65504 while every module's output is small."""
    parts = workloads.healthy()
    return {**parts, "loss_fn": lambda out, y: ((out - (100 * y).to(out.dtype)) ** 2).sum()}


def test_a_loss_that_overflows_on_its_own_is_told_apart_from_the_modules():
    d = scalertune.diagnose(summed_in_float16, device="cpu", steps=2)
    assert d.kind == "loss" and d.culprits == [] and d.islands == []
    assert "the loss function overflows float16" in d.verdict
    assert gradscaler(summed_in_float16, AmpConfig(), steps=2)[1] is False


def nan_gradients_in_float32():
    parts = workloads.healthy()
    mse = parts["loss_fn"]
    return {**parts, "loss_fn": lambda out, y: mse(out.float(), y) + (out.float() * 0).sqrt().sum()}


def test_a_workload_whose_float32_gradients_are_nan_is_not_blamed_on_float16():
    d = scalertune.diagnose(nan_gradients_in_float32, device="cpu", steps=2)
    assert d.kind == "float32" and d.suggested_init_scale is None and d.islands == []
    assert "float32 itself goes non-finite (its parameter gradients" in d.verdict
    assert d.next_command("model.py:make_model") is None


def test_a_workload_that_raises_in_float16_is_one_line_and_exit_1(capsys):
    assert main(["diagnose", spec("raises_in_float16"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "float16 training of the workload raised RuntimeError" in err


def test_gradient_overflow_agrees_with_gradscaler_and_the_scale_it_suggests_skips_nothing():
    d = scalertune.diagnose(workloads.gradient_overflow, init_scale=2.0**24, device="cpu")
    assert d.kind == "gradient-overflow" and d.islands == [] and d.culprits == []
    assert (
        d.skipped == gradscaler(workloads.gradient_overflow, AmpConfig(init_scale=2.0**24))[0] > 0
    )
    assert d.overflowing_gradients
    assert _policy.SCALE_FLOOR <= d.suggested_init_scale < 2.0**24
    assert gradscaler(
        workloads.gradient_overflow, AmpConfig(init_scale=d.suggested_init_scale)
    ) == (0, True)
    assert f"at init_scale {d.suggested_init_scale:g} GradScaler skipped none" in d.verdict
    assert "(checked)" in d.verdict


def test_underflow_at_scale_one_is_measured_and_the_larger_scale_is_checked():
    d = scalertune.diagnose(workloads.underflow, init_scale=1.0, device="cpu")
    assert d.kind == "underflow" and d.islands == []
    assert d.skipped == 0 == gradscaler(workloads.underflow, AmpConfig(init_scale=1.0))[0]
    assert d.underflow_share > 0.9
    assert 1.0 < d.suggested_init_scale <= _diagnose_policy.DIAGNOSE_MAX_SCALE
    check = next(c for c in d.checks if c.config.init_scale == d.suggested_init_scale)
    assert check.skipped == 0 and check.flushed <= _policy.UNDERFLOW_SHARE
    assert gradscaler(workloads.underflow, AmpConfig(init_scale=d.suggested_init_scale))[0] == 0


def test_clean_only_when_gradscaler_skips_nothing_and_little_flushes():
    d = scalertune.diagnose(workloads.healthy, init_scale=256.0, device="cpu")
    assert d.kind == "clean" and d.skipped == 0
    assert d.underflow_share <= _policy.UNDERFLOW_SHARE
    assert gradscaler(workloads.healthy, AmpConfig(init_scale=256.0))[0] == 0
    # the same model at PyTorch's default scale does skip, and diagnose says so
    d = scalertune.diagnose(workloads.healthy, device="cpu")
    assert d.skipped == gradscaler(workloads.healthy, AmpConfig())[0] > 0
    assert d.kind == "gradient-overflow"


def test_a_loss_returned_in_a_dict_does_not_count_as_a_gradient():
    class Returns(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

        def forward(self, x, y):
            out = self.net(x)
            return {"loss": nn.functional.mse_loss(out, y), "prediction": out}

    def factory():
        torch.manual_seed(0)
        model = Returns()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

        def step(model, batch, amp):
            optimizer.zero_grad(set_to_none=True)
            with amp.autocast():
                loss = model(*batch)["loss"]
            amp.backward(loss)
            amp.step(optimizer)
            return loss

        x = torch.randn(32, 8)
        return {
            "model": model,
            "optimizer": optimizer,
            "step": step,
            "batches": [(x, 0.1 * x.sum(1, keepdim=True))],
        }

    d = scalertune.diagnose(factory, init_scale=1024.0, device="cpu")
    root = next(m for m in d.modules if m.name == "")
    # d loss / d loss is 1; the prediction's true gradient is far smaller
    assert root.backward["float32"].absmax < 0.5
    assert d.grad_absmax < 0.5
    assert d.kind == "clean" and d.skipped == 0


def test_a_step_of_its_own_is_answered_as_in_training():
    """Under diagnose the step's own code passes backward its arguments, and amp.step says
    whether the optimizer stepped: a scheduler advanced only then keeps pace with it."""
    schedulers = []

    def factory():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1000)
        schedulers.append(scheduler)

        def step(model, batch, amp):
            optimizer.zero_grad(set_to_none=True)
            with amp.autocast():
                loss = nn.functional.mse_loss(model(batch[0]), batch[1])
            amp.backward(loss, retain_graph=True)
            if amp.step(optimizer):
                scheduler.step()
            return loss

        x = torch.randn(32, 8)
        return {
            "model": model,
            "optimizer": optimizer,
            "step": step,
            "batches": [(x, 0.1 * x.sum(1, keepdim=True))],
        }

    d = scalertune.diagnose(factory, init_scale=1024.0, steps=20, device="cpu")
    assert d.kind == "clean" and d.skipped == 0
    assert schedulers and [s.last_epoch for s in schedulers] == [20] * len(schedulers)


def test_no_hooks_are_left_on_a_model():
    attention = example("attention")
    record = run_config(
        attention.make_model, AmpConfig(dtype="bfloat16"), steps=20, seed=0, device=CPU
    )
    assert not record.pruned
    torch.manual_seed(0)
    model = attention.make_model()["model"]
    scalertune.diagnose(attention.make_model, steps=1, device="cpu")
    # diagnose works on its own fresh workloads and removes its hooks
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_diagnose_command_prints_the_table_the_checks_the_verdict_and_the_next_step(tmp_path):
    proc = run_cli("diagnose", ATTENTION, "--device", "cpu", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "turned finite inputs into inf/NaN: attn.score" in out
    assert "checked with real GradScaler steps" in out
    assert "Verdict: forward overflow in module 'attn.score'" in out
    # a study of its own: the plain study of the same factory refuses another space
    study = default_study_name(ATTENTION) + "+fp32"
    assert out.rstrip().endswith(
        f"Next: scalertune search {ATTENTION} --fp32-modules attn.score --study-name {study}"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--init-scale", "nan"], "--init-scale must be a finite number >= 1.17549e-38, got nan"),
        (["--init-scale", "inf"], "--init-scale must be a finite number >= 1.17549e-38, got inf"),
        (["--init-scale", "0"], "--init-scale must be a finite number >= 1.17549e-38, got 0"),
        (["--init-scale", "-4"], "--init-scale must be a finite number >= 1.17549e-38, got -4"),
        (["--fp32-modules", "attn.scroe"], "did you mean 'attn.score'?"),
        (["--fp32-modules", "*.nothing"], "pattern '*.nothing' matches no module"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_anything_runs(capsys, monkeypatch, args, message):
    ran = []
    monkeypatch.setattr("scalertune._diagnose._api._Runner.__call__", lambda *a, **k: ran.append(a))
    assert main(["diagnose", ATTENTION, "--device", "cpu", *args]) == 2
    err = capsys.readouterr()
    assert message in err.err and err.err.count("\n") == 1 and err.out == ""
    assert not ran


@pytest.mark.skipif(torch.cuda.is_available(), reason="asks for a device this machine lacks")
def test_a_device_given_as_a_torch_device_is_checked_as_one_given_by_name():
    """The one device check, whichever way the device is given: no model is built on it."""
    built = []

    def factory():
        built.append(True)
        return workloads.healthy()

    for device in ("cuda", torch.device("cuda"), torch.device("cuda:3")):
        with pytest.raises(scalertune.UsageError, match="this machine has no CUDA device"):
            scalertune.diagnose(factory, device=device)
    assert not built


def test_an_unknown_island_in_a_search_is_a_usage_error_and_nothing_is_written(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    for islands, message in [
        ("attn.nope", "fp32_modules names 'attn.nope'"),
        ("attn.*,*.wo", "pattern '*.wo' matches no module"),
    ]:
        assert main(["search", ATTENTION, "--fp32-modules", islands]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
        assert not (tmp_path / "scalertune.db").exists()
