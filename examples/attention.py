"""A tiny attention model with unscaled logits on large embeddings: float16's forward overflow.

The attention scores are q @ k^T without the 1/sqrt(d) factor, on embeddings whose entries
are ~300: the logits reach ~1e5, beyond float16's 65504, so they are inf before any loss scale
applies and softmax turns them into NaN. No GradScaler setting fixes that. bfloat16 does, and
so does keeping the score module in float32 (a "float32 island").

    scalertune diagnose examples/attention.py:make_model
    scalertune search examples/attention.py:make_model --fp32-modules attn.score
"""

import torch
from torch import nn

VOCAB, DIM, LENGTH = 64, 32, 16


class Scores(nn.Module):
    """Attention weights from queries and keys, deliberately without 1/sqrt(dim)."""

    def forward(self, q, k):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.score = Scores()

    def forward(self, x):
        return self.score(self.q(x), self.k(x)) @ self.v(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        with torch.no_grad():
            self.embed.weight.mul_(300.0)
        self.attn = Attention()
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        return self.head(self.attn(self.embed(tokens)).mean(dim=1))


def make_model():
    model = Model()
    tokens = torch.randint(0, VOCAB, (512, LENGTH))
    labels = tokens.max(dim=1).values  # the largest token in the sequence
    batches = [(tokens[i : i + 64], labels[i : i + 64]) for i in range(0, 512, 64)]
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=3e-3),
        "loss_fn": nn.CrossEntropyLoss(),
        "batches": batches,
    }
