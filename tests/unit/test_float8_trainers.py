"""A float8 YAML attached to real trainers: a Hugging Face Trainer, a Lightning Trainer and an
Accelerate Accelerator (before prepare).

Each run asserts that the Linear layers are converted and train (the loss falls, finite) with
the precision around float8 the YAML says, that the in-run check runs inside the trainer and
its float32 pass sees plain Linear layers (bit for bit ``F.linear``), and that the trainer's
training is the runtime's own loop (``AmpRuntime(config).prepare(model)`` on the same
batches) bit for bit. Every run is a tiny model under torchao's emulation on the CPU."""

import math
import warnings

import pytest
import torch
import trainers
from torch import nn

import scalertune
from scalertune import AmpConfig, AmpRuntime, CheckPolicy
from scalertune._amp import _float8
from scalertune._amp._schema import read_result, write_result
from scalertune._inrun._build import in_run_check

pytest.importorskip("torchao")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

CHECK = {"every": 5, "action": "act", "window": 5}
#: The precision around float8: bfloat16 autocast, or none.
AROUND = ("bfloat16", "float32")


def _config(around, recipe="rowwise"):
    return AmpConfig(dtype="float8", float8_recipe=recipe, float8_around=around)


def _yaml(tmp_path, config):
    path = str(tmp_path / "amp.yaml")
    write_result({"config": config.to_dict(), "check": dict(CHECK)}, path)
    return path


def _runtime(config, path=None):
    """The runtime's own: the config, and the YAML's check policy (``CHECK`` without one)."""
    check = None if path is not None else CheckPolicy(**CHECK)
    result = (read_result(path), path) if path is not None else None
    return AmpRuntime(config, device="cpu", check=in_run_check(result, check))


def _watch(layer):
    """Each forward of ``layer``: whether it computed in float8, its output's dtype, whether
    autocast was on, and whether its output is a plain ``F.linear`` of its input, bit for bit."""
    seen = []

    def hook(module, args, out):
        with torch.no_grad():
            plain = torch.equal(out, nn.functional.linear(args[0], module.weight, module.bias))
        seen.append(
            (_float8._active() is not None, out.dtype, torch.is_autocast_enabled("cpu"), plain)
        )

    layer.register_forward_hook(hook)
    return seen


def _assert_forwards(seen, around, steps, checks):
    """Every training forward computed in float8 within ``around``; each check's float32 pass
    (one more forward) through a plain Linear layer, in float32, without autocast."""
    training = (True, getattr(torch, around), around == "bfloat16", False)
    float32 = (False, torch.float32, False, True)
    assert seen.count(training) == steps and seen.count(float32) == checks, set(seen)
    assert len(seen) == steps + checks


def _assert_checked(amp, steps, every=CHECK["every"]):
    """The in-run check ran every ``every`` steps, the run's loss near float32's at the same
    weights (a healthy run: float8's noise on a small loss, within the check's rule of 1.25x),
    and took no action; returns its (step, loss, float32's loss) records."""
    state = amp.state_dict()["check"]
    checks = state["checks"]
    assert [c[0] for c in checks] == list(range(0, steps, every))
    assert all(0.8 < loss / float32 < 1.2 for _, loss, float32 in checks), checks
    assert state["actions"] == [] and amp.steps == steps
    return checks


def _assert_learns(losses, by=0.9):
    """Finite losses, the last three's mean below ``by`` times the first three's."""
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) < by * sum(losses[:3]), losses


# --- Hugging Face ---------------------------------------------------------------------------

HF_STEPS = 15


def _llama():
    """A tiny Llama (no dropout): one layer of 7 Linear layers and the output layer, every size
    a multiple of 16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=trainers.VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=trainers.LENGTH,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("around", AROUND)
def test_a_hf_trainer_trains_a_float8_yaml_as_the_runtimes_own_loop_bit_for_bit(tmp_path, around):
    from transformers import Trainer

    config = _config(around)
    path = _yaml(tmp_path, config)
    arguments = trainers._arguments(
        output_dir=str(tmp_path / "out"),
        max_steps=HF_STEPS,
        gradient_accumulation_steps=1,
        warmup_steps=0,
        lr_scheduler_type="constant",
        logging_steps=HF_STEPS,
    )
    trainer = Trainer(model=_llama(), args=arguments, train_dataset=trainers.Sequences())
    amp = scalertune.attach(trainer, path)  # the YAML's check: every 5 steps, act
    assert len(_float8.float8_layers(trainer.model)) == 8
    assert not any(type(m) is nn.Linear for m in trainer.model.modules())
    seen = _watch(trainer.model.model.layers[0].mlp.down_proj)
    batches = []
    own_step = trainer.training_step

    def training_step(model, inputs, num_items_in_batch=None):
        batches.append(({k: v.clone() for k, v in inputs.items()}, num_items_in_batch))
        return own_step(model, inputs, num_items_in_batch)

    trainer.training_step = training_step
    losses, skipped = trainers.hf_losses_and_skips(trainer)
    assert skipped == [] and len(losses) == HF_STEPS
    _assert_learns(losses, by=0.95)  # a language model's first steps
    checks = _assert_checked(amp, HF_STEPS)
    _assert_forwards(seen, around, HF_STEPS, len(checks))

    # the runtime's own loop on the same batches: the Trainer's AdamW, its constant rate, its
    # loss over the step's items (what the Trainer hands the model)
    model = _llama()
    ours = _runtime(config, path)
    ours.prepare(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=arguments.learning_rate, weight_decay=0)
    plain = []
    for inputs, items in batches:
        loss = ours.loss(lambda i=inputs, n=items: model(**i, num_items_in_batch=n).loss)
        ours.backward(loss)
        ours.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        plain.append(loss.item())
    assert losses == plain
    assert ours.state_dict()["check"]["checks"] == checks


# --- Lightning ------------------------------------------------------------------------------

LIGHTNING_STEPS = 30


def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 16)
    )


def _loss(out, y):
    return nn.functional.mse_loss(out[:, :1].float(), y)


def _loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(192, 16, generator=g)
    data = torch.utils.data.TensorDataset(x, torch.tanh(x[:, :3].sum(1, keepdim=True)))
    return torch.utils.data.DataLoader(data, batch_size=16)  # no shuffling: the same batches


def _batches(steps):
    return [b for _, b in zip(range(steps), (b for _ in range(3) for b in _loader()))]


def _own_losses(config, steps):
    """The runtime's own loop (``train_step``) on the same batches, Adam at 1e-2."""
    model = _net()
    amp = _runtime(config)
    amp.prepare(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = [float(amp.train_step(model, optimizer, _loss, b)) for b in _batches(steps)]
    return losses, amp.state_dict()["check"]["checks"]


def _lightning_module():
    import lightning.pytorch as pl

    class Regressor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _net()

        def training_step(self, batch, batch_idx):
            loss = _loss(self.net(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    return Regressor()


@pytest.mark.parametrize("around", AROUND)
def test_a_lightning_trainer_trains_a_float8_config_as_the_runtimes_own_loop_bit_for_bit(around):
    import lightning.pytorch as pl

    config = _config(around)
    trainer = trainers.lightning_trainer(
        max_steps=LIGHTNING_STEPS, accumulate_grad_batches=1, gradient_clip_val=None
    )
    amp = scalertune.attach(trainer, config, check=CheckPolicy(**CHECK))
    # Lightning's own name for the precision around float8: no autocast for float32
    assert trainer.precision == ("bf16-mixed" if around == "bfloat16" else "32-true")
    module, seen = _lightning_module(), []

    class Watch(pl.Callback):
        def on_train_start(self, trainer, module):  # converted by then (convert_module)
            seen.extend([len(_float8.float8_layers(module)), _watch(module.net[2])])

    trainer.callbacks.append(Watch())
    losses, skipped = trainers.lightning_losses_and_skips(trainer, module, _loader())
    count, seen = seen
    assert count == 3 and skipped == [] and len(losses) == LIGHTNING_STEPS
    _assert_learns(losses)
    checks = _assert_checked(amp, LIGHTNING_STEPS)
    _assert_forwards(seen, around, LIGHTNING_STEPS, len(checks))
    assert (losses, checks) == _own_losses(config, LIGHTNING_STEPS)


def test_the_in_run_check_acts_inside_a_lightning_fit_on_a_failing_tensorwise_run():
    import float8_workloads as fw
    import lightning.pytorch as pl

    torch.manual_seed(0)
    workload = fw.workload(70, lambda step: fw.MASSIVE)  # a row in 16 spoils tensorwise

    class Massive(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = workload["model"]

        def training_step(self, batch, batch_idx):
            return fw._weighted_mse(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=2e-3, weight_decay=0.0)

    trainer = trainers.lightning_trainer(
        max_steps=70, accumulate_grad_batches=1, gradient_clip_val=None
    )
    amp = scalertune.attach(
        trainer, AmpConfig(dtype="float8"), check=CheckPolicy(every=5, window=3)
    )
    loader = torch.utils.data.DataLoader(workload["batches"], batch_size=None)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        losses, _ = trainers.lightning_losses_and_skips(trainer, Massive(), loader)
    lines = [str(w.message) for w in said if w.category is scalertune.AmpCheckWarning]
    actions = amp.state_dict()["check"]["actions"]
    assert actions and [a["line"] for a in actions] == lines
    # inside Lightning's own forward the check's pass of rowwise is rowwise's (it was
    # tensorwise's, and the run went to an island, then float32)
    assert [a["kind"] for a in actions] == ["recipe"], lines
    assert amp.config == AmpConfig(dtype="float8", float8_recipe="rowwise")
    assert all(math.isfinite(x) for x in losses) and amp.steps == 70


# --- Accelerate -----------------------------------------------------------------------------

ACCELERATE_STEPS = 30


@pytest.mark.parametrize("around", AROUND)
def test_an_accelerator_trains_a_float8_config_as_the_runtimes_own_loop_bit_for_bit(around):
    from accelerate import Accelerator

    config = _config(around)
    accelerator = Accelerator(cpu=True)
    amp = scalertune.attach(accelerator, config, check=CheckPolicy(**CHECK))
    net = _net()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(net, optimizer)
    assert len(_float8.float8_layers(model)) == 3
    seen = _watch(model[2])
    losses = []
    for x, y in _batches(ACCELERATE_STEPS):
        loss = amp.loss(lambda x=x, y=y: _loss(model(x), y))  # the loop hands it its loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    _assert_learns(losses)
    checks = _assert_checked(amp, ACCELERATE_STEPS)
    _assert_forwards(seen, around, ACCELERATE_STEPS, len(checks))
    assert (losses, checks) == _own_losses(config, ACCELERATE_STEPS)


@pytest.fixture
def _one_accelerator():
    """An Accelerator made with mixed_precision="fp8" sets Accelerate's shared state: undone."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.usefixtures("_one_accelerator")
@pytest.mark.parametrize("dtype", ["float8", "bfloat16"])
def test_an_accelerators_own_float8_is_set_aside_for_the_runtimes(dtype):
    from accelerate import Accelerator
    from torchao.float8.float8_linear import Float8Linear

    accelerator = Accelerator(cpu=True, mixed_precision="fp8")  # torchao's, on its own
    amp = scalertune.attach(accelerator, AmpConfig(dtype=dtype, float8_recipe="rowwise"))
    torch.manual_seed(0)
    net = nn.Sequential(*(nn.Linear(32, 32) for _ in range(4)))  # Accelerate's own skips the
    model = accelerator.prepare(net)  # first and the last: it would convert the middle two
    ours = _float8.float8_layers(model)
    assert [m for m in model if isinstance(m, Float8Linear) and m not in ours] == []
    assert len(ours) == (4 if dtype == "float8" else 0)
    x = torch.randn(8, 32)
    loss = amp.loss(lambda: model(x).square().mean())
    accelerator.backward(loss)
    assert math.isfinite(float(loss))


def test_an_fp8_backend_named_in_the_environment_is_refused_in_one_line(monkeypatch):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "AO")
    with pytest.raises(scalertune.UsageError, match="ACCELERATE_FP8_BACKEND=AO") as raised:
        scalertune.attach(accelerator, _config("float32"))
    assert "\n" not in str(raised.value)
