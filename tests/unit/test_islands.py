"""Float32 islands behave like ordinary modules: copies, pickles, checkpoints and compiled
models keep each island on the module (and the weights) it belongs to."""

import copy
import io
import pickle

import pytest
import torch
import workloads
import yaml
from torch import nn

import scalertune
from scalertune import AmpConfig, AmpGuardError, AmpRuntime, Guard, UsageError
from scalertune._amp._islands import is_island

ISLAND = AmpConfig(init_scale=1024.0, fp32_modules=("up",))


def islanded():
    """The workload whose first layer overflows float16 (``up``), with ``up`` in float32."""
    torch.manual_seed(0)
    parts = workloads.forward_overflow()
    amp = AmpRuntime(ISLAND, device="cpu")
    return amp.prepare(parts["model"]), amp, parts


def forward(model, amp, x):
    """The model's output under autocast, and the dtype ``up`` produced."""
    seen = {}

    def record(_module, _inputs, output):
        seen["dtype"] = output.dtype

    handle = model.up.register_forward_hook(record)
    with amp.autocast():
        out = model(x)
    handle.remove()
    return out, seen["dtype"]


def test_an_island_keeps_its_module_finite_in_float32_and_nothing_else():
    model, amp, parts = islanded()
    x = parts["batches"][0][0]
    out, dtype = forward(model, amp, x)
    assert dtype == torch.float32 and torch.isfinite(out).all()
    assert out.dtype == torch.float16  # the next module is under autocast again
    plain = workloads.forward_overflow()["model"]
    with amp.autocast():
        assert not torch.isfinite(plain(x)).all()
    assert not torch.is_autocast_enabled("cpu")  # autocast restored after the island
    assert type(model.up) is nn.Linear and "forward" not in vars(model.up)


def test_a_deepcopy_runs_its_island_on_its_own_weights():
    model, amp, parts = islanded()
    x = parts["batches"][0][0]
    twin = copy.deepcopy(model)  # what EMA and SWA do
    with torch.no_grad():
        twin.up.weight.mul_(0.5)
    out, dtype = forward(twin, amp, x)
    assert dtype == torch.float32 and is_island(twin.up)
    with torch.autocast("cpu", enabled=False):
        expected = twin.down(twin.up(x) / 1e5)
    assert torch.allclose(out.float(), expected, rtol=1e-2, atol=1e-3)
    assert not torch.allclose(out, forward(model, amp, x)[0])


def test_pickle_and_torch_save_keep_the_island():
    model, amp, parts = islanded()
    x = parts["batches"][0][0]
    reference, _ = forward(model, amp, x)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for restored in (torch.load(buffer, weights_only=False), pickle.loads(pickle.dumps(model))):
        out, dtype = forward(restored, amp, x)
        assert dtype == torch.float32 and torch.equal(out, reference)


def test_a_state_dict_round_trip_is_unchanged_by_islands():
    model, amp, parts = islanded()
    x = parts["batches"][0][0]
    plain = workloads.forward_overflow()["model"]
    assert list(model.state_dict()) == list(plain.state_dict())
    fresh = AmpRuntime(ISLAND, device="cpu").prepare(workloads.forward_overflow()["model"])
    fresh.load_state_dict(model.state_dict())
    assert torch.equal(forward(fresh, amp, x)[0], forward(model, amp, x)[0])


def test_applying_islands_twice_is_harmless():
    model, amp, parts = islanded()
    amp.prepare(model)
    AmpRuntime(ISLAND, device="cpu").prepare(model)
    AmpRuntime(ISLAND, device="cpu").prepare(copy.deepcopy(model))
    assert len(model.up._forward_pre_hooks) == 1 and len(model.up._forward_hooks) == 1
    assert torch.isfinite(forward(model, amp, parts["batches"][0][0])[0]).all()


def test_torch_compile_keeps_the_island():
    model, amp, parts = islanded()
    x, y = parts["batches"][0]
    reference, _ = forward(model, amp, x)
    compiled = torch.compile(model, backend="aot_eager")
    with amp.autocast():
        out = compiled(x)
    assert torch.equal(out, reference)
    # and prepare() on a compiled model finds the modules by their own names
    other = torch.compile(workloads.forward_overflow()["model"], backend="aot_eager")
    AmpRuntime(ISLAND, device="cpu").prepare(other)
    assert is_island(other._orig_mod.up)
    loss = amp.train_step(compiled, parts["optimizer"], parts["loss_fn"], (x, y))
    assert torch.isfinite(loss) and amp.skipped_steps == 0


def test_patterns_select_every_matching_module():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Sequential(nn.Linear(4, 4), nn.ReLU()),
        nn.Sequential(nn.Linear(4, 4), nn.ReLU()),
        nn.Linear(4, 1),
    )
    AmpRuntime(AmpConfig(fp32_modules="*.0"), device="cpu").prepare(model)
    assert [n for n, m in model.named_modules() if is_island(m)] == ["0.0", "1.0"]
    with pytest.raises(UsageError, match=r"pattern '\*\.7' matches no module"):
        AmpRuntime(AmpConfig(fp32_modules="*.7"), device="cpu").prepare(model)


def _result_yaml(tmp_path, config):
    path = tmp_path / "amp.yaml"
    path.write_text(yaml.safe_dump({"config": config.to_dict()}))
    return str(path)


def test_the_readmes_training_loop_with_islands_trains_and_refuses_to_run_without_them(tmp_path):
    path = _result_yaml(tmp_path, AmpConfig(init_scale=256.0, fp32_modules=("u*",)))
    parts = workloads.forward_overflow()
    model, optimizer, loss_fn = parts["model"], parts["optimizer"], parts["loss_fn"]
    amp = scalertune.load(path, device="cpu")
    with pytest.raises(UsageError, match=r"call model = amp.prepare\(model\)"):
        amp.autocast()
    model = amp.prepare(model)
    for inputs, targets in parts["batches"]:
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = loss_fn(model(inputs), targets)
        amp.backward(loss)
        amp.step(optimizer)
        assert torch.isfinite(loss)
    assert amp.skipped_steps == 0


class _TwoOverflows(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 16)
        with torch.no_grad():
            self.a.weight.mul_(3e5)
            self.b.weight.mul_(3e5)

    def forward(self, x):
        return self.b(self.a(x) / 1e5).sum(dim=1, keepdim=True) / 1e5


def test_the_guard_never_advises_an_island_the_config_already_has():
    torch.manual_seed(0)
    model = _TwoOverflows()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    amp = AmpRuntime(
        AmpConfig(fp32_modules=("a",)),
        device="cpu",
        guard=Guard(min_scale=1.0, max_consecutive_skips=5, check_every=5),
    )
    batch = (torch.randn(16, 8), torch.randn(16, 1))
    with pytest.raises(AmpGuardError) as raised:
        for _ in range(10):
            amp.train_step(model, optimizer, nn.functional.mse_loss, batch)
    message = str(raised.value)
    assert "already keeps a in float32" in message and "--fp32-modules 'a'" in message
    assert "then keep it in float32" not in message
