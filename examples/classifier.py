"""A small classifier that trains well under AMP: the case where every sane config works.

Two interleaved spirals, an MLP with LayerNorm, cross-entropy, AdamW. Its gradients sit
comfortably inside float16's range, so PyTorch's defaults already train it; the search says
so, and on a GPU it tells you how much faster float16 or bfloat16 gets there.

    scalertune search examples/classifier.py:make_model
"""

import math

import torch
from torch import nn


def spirals(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.rand(n) * 3 * math.pi
    label = torch.randint(0, 2, (n,))
    sign = 1 - 2 * label.float()
    x = torch.stack((t * torch.cos(t) * sign, t * torch.sin(t) * sign), dim=1) / 10
    return x + 0.02 * torch.randn_like(x), label


def make_model():
    model = nn.Sequential(
        nn.Linear(2, 128),
        nn.LayerNorm(128),
        nn.GELU(),
        nn.Linear(128, 128),
        nn.LayerNorm(128),
        nn.GELU(),
        nn.Linear(128, 2),
    )
    x, y = spirals(2048)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=128, shuffle=True
    )
    return {
        "model": model,
        "optimizer": torch.optim.AdamW(model.parameters(), lr=3e-3),
        "loss_fn": nn.CrossEntropyLoss(),
        "batches": loader,
    }
