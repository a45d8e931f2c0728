"""float8 and one massive value: torchao's default recipe flushes a tensor to zero, per row
does not.

    pip install 'scalertune[float8]'
    scalertune search examples/float8.py:make_model --space float8

A regression MLP whose batches carry, in one row of every 16, a raw value of 1e6 in a feature
the loss ignores: a sink row, as an attention sink's token or an outlier channel carries one
in a large model (1e4-1e6). float8's e4m3 keeps a range of 448 down to 2**-9 and is scaled
per tensor by torchao's default recipe (``tensorwise``): the scale that brings 1e6 to 448
sends every ordinary value of the same tensor (about 1) below 2**-9, to zero, and the first
layer sees almost nothing of its input. A scale per row (``rowwise``) spoils the sink row
only, which the loss does not count.

What the search shows (about 12 s on 2 idle CPU cores, up to a minute on busy ones):

- before the runs, on stderr: ``float8: head left out of float8 (sizes not multiples of 16
  ...)``: the last layer (64 -> 1) cannot take a float8 matmul and runs in the precision
  around float8; and what tensorwise does to each layer's input at the first step (``layer
  'body.0': input amax 1e+06 ...: 96.4% of its nonzero inputs flush to zero``);
- ``torchao-default`` (``AmpConfig(dtype="float8")``) stays about 4x float32's loss: never at
  the target, or stopped as slower once a rowwise trial reached it;
- the rowwise trials follow float32: the best AMP config (``evidence.best_amp``) is float8
  per row (a trial may also keep ``body.0``, the layer tensorwise spoils most, out of float8);
- on a CPU torchao emulates float8 (its numerics, not its speed): the summary claims no
  speed and the answer is float32; on a GPU with float8 matmuls (CUDA capability 8.9+),
  load the best AMP config (``scalertune.load(yaml, best_amp=True)``) or search there.
"""

import torch
from torch import nn

#: The sink rows' value, and one row in this many carries it.
MASSIVE, EVERY = 1e6, 16
FEATURES, HIDDEN, BATCH, STEPS = 32, 64, 64, 200


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        # 32 -> 64 -> 64: multiples of 16, float8 takes them
        self.body = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU()
        )
        self.head = nn.Linear(HIDDEN, 1)  # 64 -> 1: left out of float8

    def forward(self, x):
        return self.head(self.body(x))


def weighted_mse(output, target):
    """The mean squared error over the ordinary rows (the target's second column is each row's
    weight: 0 for a sink row)."""
    weight = target[:, 1:]
    return ((output.float() - target[:, :1]) ** 2 * weight).sum() / weight.sum()


def make_model():
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(FEATURES - 1, 1, generator=g) / (FEATURES - 1) ** 0.5
    batches = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, FEATURES, generator=g)
        x[:, -1] = 0.0
        sinks = torch.arange(0, BATCH, EVERY)
        x[sinks, -1] = MASSIVE  # the massive value, in a feature nothing else uses
        y = torch.tanh(3 * x[:, :-1] @ teacher) + 0.3 * torch.randn(BATCH, 1, generator=g)
        weight = torch.ones(BATCH, 1)
        weight[sinks] = 0.0  # the loss ignores the sink rows
        batches.append((x, torch.cat([y, weight], dim=1)))
    model = Net()
    return {
        "model": model,
        "optimizer": torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0),
        "loss_fn": weighted_mse,
        "batches": batches,
    }
