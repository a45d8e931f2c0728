"""Regress the Unicode code points of "中野哲平" from noise: a float16 overflow, on purpose.

The toy from the article this project started from. The targets are raw code points around
2e4-3.7e4, and the loss is summed over the batch, so the loss is ~1e10 and its gradient with
respect to the output (2 * (output - target), summed) is beyond float16's 65504 even
*unscaled*. With PyTorch's default init_scale of 65536 the first steps overflow and are
skipped while the scaler backs off below 1. Whether a config then trains as well as float32
depends on how far it backs off and whether it grows back.

    scalertune search examples/codepoints.py:make_model
"""

import torch
from torch import nn

TEXT = "中野哲平"


def make_model():
    code_points = torch.tensor([float(ord(c)) for c in TEXT])
    model = nn.Sequential(nn.Linear(len(TEXT), 64), nn.ReLU(), nn.Linear(64, len(TEXT)))
    batches = [(torch.randn(16, len(TEXT)), code_points.expand(16, -1).clone()) for _ in range(8)]
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.5),
        "loss_fn": nn.MSELoss(reduction="sum"),
        "batches": batches,
    }
