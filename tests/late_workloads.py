"""Tiny workloads whose AMP failures show only late: after the 200-step trial, within a horizon
of 1600-3000 steps. Each trains at 0.5-1.5 ms a float32 step on one CPU thread.

Factories take no arguments, as scalertune calls them; build them after seeding torch (the
data is drawn from torch's global RNG, the teachers from fixed generators). ``HORIZON`` names
the horizon each was measured at, and ``ISLAND`` the module a float32 island belongs on.
The figures in the docstrings are loss over float32's at the same step (10-step means, seed
0 unless a range is given over seeds 0-2), from full-length plain loops: autocast +
torch.amp.GradScaler("cpu") with PyTorch's defaults unless stated.
"""

import torch
from torch import nn

HORIZON = {}
ISLAND = {}


def readings_near_1000():
    """(a) A precision floor that opens after a few hundred steps.

    An MLP (4-32-1, ReLU, ~190 parameters) regresses readings near 1000 (1000 + a small
    tanh-teacher signal of amplitude ~3 + noise 0.3) with mean MSE and Adam lr 0.05. The
    network first has to climb to 1000 (all dtypes agree: the error is hundreds); once float32
    fits the fine part, bfloat16's output spacing at 1000 (4.0: a rounding variance of ~1.3
    per output) becomes a floor that float32 goes under. float16's spacing there is 0.5
    (variance 0.02): it holds. Median (min-max) over seeds 0-2: bfloat16 1.00x at 200 steps,
    1.03 at 1000, 1.42 (1.33-1.64) at 1500, 2.45 (2.26-2.71) at 2000; float16 defaults 1.20 at
    200 (the early back-off from 65536), 0.94 (0.93-1.28) at 2000. Keeping the last Linear
    ("2") in float32 fixes bfloat16: 1.12 (1.08-1.14) at 2000; keeping "0" does not (2.45).
    """
    g = torch.Generator().manual_seed(1234)
    teacher_w = torch.randn(4, 8, generator=g)
    teacher_v = torch.randn(8, 1, generator=g) / 8**0.5
    batches = []
    for _ in range(8):
        x = torch.randn(64, 4)
        y = 1000.0 + 3.0 * torch.tanh(x @ teacher_w) @ teacher_v + 0.3 * torch.randn(64, 1)
        batches.append((x, y))
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.05),
        "loss_fn": nn.MSELoss(),
        "batches": batches,
    }


HORIZON["readings_near_1000"] = 2000
ISLAND["readings_near_1000"] = "2"

CODEPOINTS = "中野哲平"


def _codepoints(lr):
    code_points = torch.tensor([float(ord(c)) for c in CODEPOINTS])
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 4))
    batches = [(torch.randn(16, 4), code_points.expand(16, -1).clone()) for _ in range(8)]
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=lr),
        "loss_fn": nn.MSELoss(reduction="sum"),
        "batches": batches,
    }


def codepoints_fast():
    """(b) A clip that helps early and hurts late; the code-point toy's late bfloat16 floor.

    examples/codepoints.py (4-64-4, sum MSE, targets 2e4-3.7e4) at Adam lr 0.15: the team's
    lr-0.05 figures (bfloat16 1.72x at 3200 steps, 83x at 6000) arrive about 3x sooner.
    Median (min-max) over seeds 0-2: bfloat16 1.00x at 200, 1.11 at 1000, 1.73 at 1500,
    4.43 (2.97-4.81) at 2000; float16 defaults 1.42 at 200 (the early back-off from 65536),
    0.92 (0.76-1.01) at 2000 (its own spacing at 3.7e4, 32, is a floor float32 reaches only
    after ~2500 steps: 2.0x at 3000 on seed 0). bfloat16 + clip_norm 0.453 helps early (0.24x
    at 200, 0.27 at 1000) and hurts late (1.56 at 1500, 8.6 (7.1-9.8) at 2000); float16 + the
    same clip 0.79 -> 4.8. With sum-MSE gradients of 1e4-1e7 any clip below ~1e5 always
    engages (clip 100 to 1e5 give the same curve): Adam then sees a gradient whose norm never
    shrinks, fast early, never annealing late. Keeping "2" in float32 fixes bfloat16 (1.05).
    """
    return _codepoints(0.15)


HORIZON["codepoints_fast"] = 2000
ISLAND["codepoints_fast"] = "2"


def codepoints():
    """examples/codepoints.py as shipped (Adam lr 0.5): bfloat16 with clip_norm 0.453 is
    0.37x float32 at 200 steps, 27x at 800, 333x at 1600 on seed 0 (the team's figures,
    reproduced exactly; seeds 0-2: 0.19-0.37, 17-58, 333-3270). Its float32 reference itself
    spikes and is chaotic (float32 seed over seed ranges 0.26-8.5 at 1200), so use it for the
    clip and for bfloat16's floor (37-209x at 1600), not where a config should hold."""
    return _codepoints(0.5)


HORIZON["codepoints"] = 1600
ISLAND["codepoints"] = "2"


class _RawInputsLayerNorm(nn.Module):
    """Raw (unnormalised) inputs into a Linear followed by LayerNorm: the LayerNorm makes the
    loss invariant to the scale of ``up``'s weights, and Adam's updates, orthogonal to them on
    average, grow their norm (roughly as sqrt(steps)): ``up``'s output amax climbs steadily
    while nothing downstream sees it."""

    def __init__(self, input_scale: float = 2.2e3):
        super().__init__()
        self.input_scale = input_scale
        self.up = nn.Linear(4, 32)
        self.norm = nn.LayerNorm(32)
        self.act = nn.GELU()
        self.down = nn.Linear(32, 1)

    def forward(self, x):
        return self.down(self.act(self.norm(self.up(x * self.input_scale))))


def growing_activations():
    """(c) A forward amax that trends up until float16's range runs out.

    ``up``'s output (median per-step amax over 100 steps) grows from ~3-4e4 at step 200 to
    ~5-7e4 at 1600 and 7-11e4 at 3000 (float32, seeds 0-2). float16 trains like float32 in the
    200-step trial, then overflows in the forward pass (first inf at steps 577/2176/1389 on
    seeds 0/1/2) and dies from every-step overflow (50 skipped in a row) at 1781/2519/1785:
    late, and no loss scale can fix it. bfloat16 holds. The float32 island belongs on ``up``
    (the module with the growing output), not on ``down`` (the one feeding the loss).
    Adam lr 0.2, mean MSE on sin(x . w) + noise 0.3 (a task the model underfits, so the
    gradient never dies and the growth never stops).
    """
    g = torch.Generator().manual_seed(99)
    teacher = torch.randn(4, 1, generator=g)
    batches = []
    for _ in range(8):
        x = torch.randn(64, 4)
        batches.append((x, torch.sin(x @ teacher) + 0.3 * torch.randn(64, 1)))
    model = _RawInputsLayerNorm()
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.2),
        "loss_fn": nn.MSELoss(),
        "batches": batches,
    }


HORIZON["growing_activations"] = 3000
ISLAND["growing_activations"] = "up"


def plateau_mlp():
    """(d) bfloat16 that follows float32 from float32's weights but stalls on its own way.

    A regression MLP (8 -> 256 -> 256 -> 1, tanh) on y = 500 + 50 sin(x . w), summed MSE,
    Adam lr 1e-2, written by a new user. Trained from step 0, bfloat16 stops on a plateau
    near 3.4e4 while float32 goes on down: 1.30x float32's loss at step 1000 and 1.84x at
    2000 on seed 0 (2.3x/7.8x on seed 1, 8.2x/60x on seed 2). Branched from float32's
    checkpoints at 1000 and 1800 it holds (0.98x, 0.99x): a branch shows whether a config can
    follow float32, not whether it gets there. PyTorch's float16 defaults end at 0.23x.
    """
    g = torch.Generator().manual_seed(4321)
    w = 0.3 * torch.randn(8, 1, generator=g)
    batches = []
    for _ in range(8):
        x = torch.randn(32, 8, generator=g)
        batches.append((x, 500.0 + 50.0 * torch.sin(x @ w)))
    model = nn.Sequential(
        nn.Linear(8, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 1)
    )
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-2),
        "loss_fn": lambda out, y: ((out - y) ** 2).sum(),
        "batches": batches,
    }


HORIZON["plateau_mlp"] = 2000


class _Times(nn.Module):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


def readings_near_1e5():
    """(e) readings_near_1000 in units 100 times smaller: the same model and data, its output
    times 100 by a last module ("3") and the targets with it (Adam makes the training
    float32's own). bfloat16 fails late as there; float16 overflows in "3" from the first
    step (1e5 > 65504), so no float16 config reaches the target, and keeping "2" in float32
    (its output, and so "3"'s, stays float32) is what holds.
    """
    workload = readings_near_1000()
    workload["model"] = nn.Sequential(*workload["model"], _Times(100.0))
    workload["optimizer"] = torch.optim.Adam(workload["model"].parameters(), lr=0.05)
    workload["batches"] = [(x, 100.0 * y) for x, y in workload["batches"]]
    return workload


HORIZON["readings_near_1e5"] = 2000
ISLAND["readings_near_1e5"] = "2"


def tanh_regression():
    """(f) A loss scale that collapses mid-run and never recovers: a late burst of large
    gradients (:func:`with_burst`).

    An MLP (8-64-1, tanh, ~640 parameters) regresses tanh(x . w) + noise 0.05 with mean MSE,
    Adam lr 3e-3 and the workload's own clipping at 1.0, as nanoGPT clips. Its gradients are
    small (1e-3 to 1e-1) and float16 trains like float32. :func:`with_burst` turns batches
    1000-1039 into a corrupted stretch of data (targets times 1e9): float32 clips those steps
    and trains on; float16 skips them, backing its scale off 2**30 to ~3e-5, where the
    gradients that follow flush to zero, and at PyTorch's growth interval of 2000 the scale
    needs ~60,000 steps to come back. Seed 0, 3000 steps: float16 defaults end 1.56x
    float32's loss (last 100 steps, burst steps left out).
    """
    g = torch.Generator().manual_seed(7)
    w = torch.randn(8, 1, generator=g)
    batches = []
    for _ in range(8):
        x = torch.randn(64, 8)
        batches.append((x, torch.tanh(x @ w) + 0.05 * torch.randn(64, 1)))
    model = nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 1))
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=3e-3),
        "loss_fn": nn.MSELoss(),
        "batches": batches,
        "clip_norm": 1.0,
    }


HORIZON["tanh_regression"] = 3000

#: Where :func:`with_burst` puts its burst, how long it lasts, and how large its targets are.
BURST = (1000, 40, 1e9)


def with_burst(batches, step, burst=BURST):
    """The batch of ``step`` in a stream over ``batches`` with a burst of corrupted targets."""
    start, length, factor = burst
    x, y = batches[step % len(batches)]
    return (x, y * factor) if start <= step < start + length else (x, y)
