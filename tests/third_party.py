"""Third-party architectures, built from config classes with random weights (no downloads).

Each factory follows scalertune's contract and stays tiny (well under 1M parameters, a few
batches), because float16 on a CPU is several times slower than float32.
"""

import torch
from torch import nn


def _tokens(vocab: int, batch: int, length: int, n: int = 2):
    return [torch.randint(0, vocab, (batch, length)) for _ in range(n)]


def gpt2():
    """Hugging Face GPT-2 returning its own loss (a ModelOutput) through a ``step``: float16
    at PyTorch's default scale trains it without a skipped step."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_head=2, n_embd=128, vocab_size=512, n_positions=64)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(model, batch, amp):
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = model(input_ids=batch, labels=batch).loss
        amp.backward(loss)
        amp.step(optimizer)
        return loss

    return {"model": model, "optimizer": optimizer, "step": step, "batches": _tokens(512, 4, 32)}


T5_WO_SCALE = 3e5


def t5():
    """Hugging Face T5 (2 encoder and 2 decoder blocks) whose feed-forward output weights are
    scaled up: every ``DenseReluDense.wo`` produces activations beyond float16's 65504 (T5's
    known float16 failure), while float32 and bfloat16 train it."""
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(
        T5Config(
            vocab_size=128,
            d_model=32,
            d_kv=8,
            num_heads=4,
            d_ff=256,
            num_layers=2,
            num_decoder_layers=2,
            dropout_rate=0.0,
            decoder_start_token_id=0,
            pad_token_id=0,
        )
    )
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith("DenseReluDense.wo"):
                module.weight.mul_(T5_WO_SCALE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(model, batch, amp):
        source, target = batch
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            out = model(input_ids=source, labels=target)
        amp.backward(out["loss"])
        amp.step(optimizer)
        return out["loss"]

    sources = _tokens(128, 4, 12)
    return {
        "model": model,
        "optimizer": optimizer,
        "step": step,
        "batches": [(s, s.flip(1)) for s in sources],
    }


FFN_SCALE = 1e6


def transformer_encoder():
    """PyTorch's own ``nn.TransformerEncoder`` (2 post-norm layers) with its feed-forward
    output weights scaled up: every ``linear2`` overflows float16 in the forward pass."""
    model = _Encoder()
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "loss_fn": nn.CrossEntropyLoss(),
        "batches": [(t, t.max(dim=1).values) for t in _tokens(64, 16, 12)],
    }


class _Encoder(nn.Module):
    """Embedding, 2 post-norm ``nn.TransformerEncoder`` layers, a head; ``ffn_scale``
    multiplies every feed-forward output weight (1.0 leaves PyTorch's initialisation)."""

    def __init__(self, ffn_scale=FFN_SCALE):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        layer = nn.TransformerEncoderLayer(
            32, 4, dim_feedforward=128, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 64)
        with torch.no_grad():
            for block in self.encoder.layers:
                block.linear2.weight.mul_(ffn_scale)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def article_mlp():
    """The network of the article this project started from: an MLP classifier, Adam, a
    cross-entropy summed over the batch, gradients clipped at 1.0. At PyTorch's default
    init_scale of 65536 its float16 gradients overflow and GradScaler skips the first steps."""
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    x = torch.randn(4, 128, 32)
    y = torch.randint(0, 10, (4, 128))
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "loss_fn": nn.CrossEntropyLoss(reduction="sum"),
        "batches": list(zip(x, y)),
        "clip_norm": 1.0,
    }


class _Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


class _ResNet(nn.Module):
    """ResNet's shape, torchvision-free: a stem, two basic residual blocks, pooling, a head."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.layer1 = nn.Sequential(_Block(16), _Block(16))
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        return self.fc(self.layer1(self.stem(x)).mean(dim=(2, 3)))


def resnet():
    """A small ResNet with a loss summed over the batch: its convolution and BatchNorm
    weight gradients (sums over every pixel of every image) overflow float16 at 65536, while
    no activation does."""
    model = _ResNet()
    return {
        "model": model,
        "optimizer": torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9),
        "loss_fn": nn.CrossEntropyLoss(reduction="sum"),
        "batches": [(torch.randn(16, 3, 16, 16), torch.randint(0, 10, (16,))) for _ in range(2)],
    }
