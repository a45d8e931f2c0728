"""Tiny real workloads, one per way float16 training goes wrong. Each trains in well under a
second on a CPU. Factories take no arguments, as scalertune calls them."""

import torch
from torch import nn

HERE = __file__


def _regression(scale_inputs: float = 1.0, scale_targets: float = 1.0, n: int = 4):
    w = torch.randn(8, 1)
    out = []
    for _ in range(n):
        x = torch.randn(32, 8) * scale_inputs
        out.append((x, x @ w * scale_targets))
    return out


def healthy():
    """Trains under every sane config: the control."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.02),
        "loss_fn": nn.MSELoss(),
        "batches": _regression(),
    }


def gradient_overflow():
    """Gradients around 1e3: fine unscaled, inf in float16 once multiplied by 2**24."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.02),
        "loss_fn": nn.MSELoss(reduction="sum"),
        "batches": _regression(scale_targets=10),
    }


def underflow():
    """A loss so small (x 1e-9) that float16 gradients flush to zero at scale 1.

    Adam normalises the gradient's size away, so any scale that keeps the gradients
    representable trains exactly like float32; at scale 1 they are all zero and the loss stays
    flat: no skipped step, no NaN, and no learning.
    """
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    mse = nn.MSELoss()
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.02),
        "loss_fn": lambda out, y: 1e-9 * mse(out, y),
        "batches": _regression(),
    }


class _BigEmbedding(nn.Module):
    """Activations of ~1e5 in the first layer: beyond float16's 65504 before any loss scale
    applies, and harmless in float32 or bfloat16, whose range reaches 3e38."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 1)
        with torch.no_grad():
            self.up.weight.mul_(3e5)

    def forward(self, x):
        return self.down(self.up(x) / 1e5)


def forward_overflow():
    model = _BigEmbedding()
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.01),
        "loss_fn": nn.MSELoss(),
        "batches": _regression(),
    }


def exploding():
    """SGD with momentum at a learning rate that explodes unless gradients are clipped.

    The user's float32 training clips at 10 (``clip_norm``), so the reference does too.
    """
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    return {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9),
        "loss_fn": nn.MSELoss(),
        "batches": _regression(scale_targets=30, n=8),
        "clip_norm": 10.0,
    }


def _healthy_with_step(before_step=None):
    """``healthy`` through a user step function; ``before_step(amp)`` runs first each step."""
    parts = healthy()
    optimizer, loss_fn = parts["optimizer"], parts["loss_fn"]

    def step(model, batch, amp):
        if before_step is not None:
            before_step(amp)
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = loss_fn(model(x), y)
        amp.backward(loss)
        amp.step(optimizer)
        return loss

    return {**parts, "step": step, "loss_fn": None}


def with_step():
    """The same as ``healthy`` but through the user's own step function."""
    return _healthy_with_step()


def slow():
    """``healthy`` at about 25 ms a step, so that a test can act in the middle of a trial."""
    import time

    return _healthy_with_step(lambda amp: time.sleep(0.025))


def _in_float16_at_step_3(crash):
    return _healthy_with_step(
        lambda amp: crash() if amp.config.dtype == "float16" and amp.steps == 3 else None
    )


def aborts_in_float16():
    import os

    return _in_float16_at_step_3(os.abort)


def hangs_in_float16():
    """Hangs at float16's step 3, first writing its process id to the file
    ``SCALERTUNE_TEST_HANG`` names (when set)."""
    import os
    import time

    def hang():
        path = os.environ.get("SCALERTUNE_TEST_HANG")
        if path:
            with open(path, "w", encoding="ascii") as f:
                f.write(str(os.getpid()))
        time.sleep(3600)

    return _in_float16_at_step_3(hang)


def interrupted_in_code_evaluated_from_c():
    """Ctrl-C arriving while CPython evaluates code called from C (``PyRun_String``, as
    pybind11's ``exec`` does): the ``KeyboardInterrupt`` comes out of the factory."""
    import ctypes

    run = ctypes.pythonapi.PyRun_String
    run.restype = ctypes.py_object
    run.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]
    scope = {}
    run(b"raise KeyboardInterrupt", 257, scope, scope)  # 257: Py_file_input


def eats_memory_in_float16():
    return _in_float16_at_step_3(lambda: torch.empty(64 * 2**30, dtype=torch.uint8).fill_(1))


def _at_step_3(crash):
    """``crash()`` on the fourth step of every run, float32 included: the one-step check of
    the factory passes, the float32 reference does not."""
    return _healthy_with_step(lambda amp: crash() if amp.steps == 3 else None)


def aborts_in_every_run():
    import os

    return _at_step_3(os.abort)


def hangs_in_every_run():
    import time

    return _at_step_3(lambda: time.sleep(3600))


def _raise(exc):
    raise exc


def raises_in_float16():
    """A config-specific failure, as nn.LSTM under CPU float16 autocast is."""
    return _healthy_with_step(
        lambda amp: (
            _raise(RuntimeError("this kernel has no float16 implementation"))
            if amp.config.dtype == "float16"
            else None
        )
    )


def always_raises():
    """Fails on every AMP run, whatever the config: the workload is broken, not a config."""
    return _healthy_with_step(
        lambda amp: (
            _raise(ValueError("labels out of range")) if amp.config.dtype != "float32" else None
        )
    )


def lightning_module():
    """A LightningModule searched through its own training_step (scalertune.lightning_workload)."""
    import lightning.pytorch as pl

    import scalertune

    class Regressor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return {"loss": loss}

        def configure_optimizers(self):
            return {"optimizer": torch.optim.Adam(self.parameters(), lr=0.02)}

    return scalertune.lightning_workload(Regressor(), _regression())


def forward_overflow_clipped():
    """``forward_overflow`` from a user whose float32 training clips at 1.0: when no AMP
    config works, the float32 answer must keep that clipping."""
    return {**forward_overflow(), "clip_norm": 1.0}


def seed_article_toy():
    """The toy of the second seed article, as written: raw code points as regression targets,
    batch 1, mean MSE, Adam at 1e-3. Its float32 loss barely moves (7.1e8 -> 7.1e8) in a
    search's budget of steps, so no run can be judged against it."""
    code_points = torch.tensor([[float(ord(c)) for c in "中野哲平"]])
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 4))
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "loss_fn": nn.MSELoss(),
        "batches": [(torch.randn(1, 4), code_points) for _ in range(100)],
    }


class CountingAdam(torch.optim.Adam):
    """Adam that counts the optimizer steps it really took: GradScaler calls ``step`` only
    when the gradients are finite, so calls = steps run - steps skipped."""

    built: list["CountingAdam"] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = 0
        CountingAdam.built.append(self)

    def step(self, closure=None):
        self.calls += 1
        return super().step(closure)


def counted_overflow():
    """``gradient_overflow`` with an optimizer that counts its real steps."""
    parts = gradient_overflow()
    return {**parts, "optimizer": CountingAdam(parts["model"].parameters(), lr=0.02)}


def reports_its_environment():
    """Raises with what its process sees: ``SCALERTUNE_TEST_MARK`` and torch's thread count."""
    import os

    raise RuntimeError(f"{os.environ.get('SCALERTUNE_TEST_MARK')} {torch.get_num_threads()}")


def seeds_itself():
    """The control, but the factory seeds torch itself, as many training scripts do at the top:
    every run trains the same whatever seed scalertune sets."""
    torch.manual_seed(1234)
    return healthy()
