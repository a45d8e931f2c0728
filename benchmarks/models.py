"""Workloads for the benchmarks that the shipped examples are too small to show.

``midsize``: a 4-layer transformer encoder classifier (3.5M parameters) whose float32 step
costs tens of milliseconds on a 2-core CPU: where a search's overhead outside training steps
(storage, sampling, model building) must stay small. ``large``: the same at 25M parameters,
for the memory a search holds against one run. Both learn a real task (the largest token of
a sequence, bucketed), so their float32 reference lowers its loss.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, LENGTH, CLASSES = 512, 64, 8


class Encoder(nn.Module):
    def __init__(self, dim: int, layers: int, ff: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        layer = nn.TransformerEncoderLayer(
            dim, nhead=4, dim_feedforward=ff, batch_first=True, dropout=0.0
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def _workload(dim: int, layers: int, ff: int, batch: int, length: int = LENGTH) -> dict:
    model = Encoder(dim, layers, ff)
    tokens = torch.randint(0, VOCAB, (batch * 16, length))
    labels = tokens.max(dim=1).values * CLASSES // VOCAB
    batches = [(tokens[i : i + batch], labels[i : i + batch]) for i in range(0, len(tokens), batch)]
    return {
        "model": model,
        "optimizer": torch.optim.AdamW(model.parameters(), lr=3e-4),
        "loss_fn": nn.CrossEntropyLoss(),
        "batches": batches,
    }


def midsize() -> dict:
    return _workload(dim=256, layers=4, ff=1024, batch=32)


def large() -> dict:
    """25M parameters on short sequences: memory is the point, not compute."""
    return _workload(dim=512, layers=8, ff=2048, batch=8, length=16)
