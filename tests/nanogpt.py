"""A small GPT in the style of nanoGPT's ``model.py``, and factories that bring it to a search
the way a nanoGPT user would: its optimizer groups, and the step of its ``train.py`` (gradient
accumulation, a hand-written warm-up + cosine learning rate kept by an ``iter_num`` of the
step's own, clipping at 1.0).

The model follows nanoGPT's design (written for these tests, not copied): pre-LayerNorm
blocks of causal self-attention (one ``c_attn`` Linear making q, k and v, ``c_proj`` after)
and a GELU MLP (``c_fc``, ``c_proj``), learned position embeddings, the token embedding tied
to ``lm_head``, weights drawn at std 0.02 (the residual projections at 0.02 / sqrt(2 layers)),
``forward(idx, targets)`` returning ``(logits, loss)``, and a greeting printed when it is
built, as nanoGPT's is. At the sizes below it has about 27,000 parameters and trains a step
in a few milliseconds on one CPU thread.

The data is a character corpus drawn from a fixed word grammar (no download): windows of it
at random offsets from a fixed generator, as nanoGPT's ``get_batch`` draws them, made once
so that every pass sees the same batches.
"""

import dataclasses
import math
import os
import uuid

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F


@dataclasses.dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 32
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout

    def forward(self, x):
        batch, length, width = x.shape
        heads = [
            t.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2)
            for t in self.c_attn(x).split(self.n_embd, dim=2)
        ]
        y = F.scaled_dot_product_attention(
            *heads, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        return self.c_proj(y.transpose(1, 2).reshape(batch, length, width))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(config.vocab_size, config.n_embd),
                "wpe": nn.Embedding(config.block_size, config.n_embd),
                "h": nn.ModuleList(Block(config) for _ in range(config.n_layer)),
                "ln_f": nn.LayerNorm(config.n_embd, bias=config.bias),
            }
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * config.n_layer))
        print(f"number of parameters: {sum(p.numel() for p in self.parameters()) / 1e6:.2f}M")

    def forward(self, idx, targets=None):
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(positions)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        """AdamW with weight decay on the matrices (2-d and up) only, as nanoGPT groups them."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


WORDS = [
    "the",
    "a",
    "one",
    "two",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "under",
    "mat",
    "log",
    "and",
    "then",
    "big",
    "small",
    "red",
]


def corpus(chars: int = 20000, *, noise: float = 0.0) -> torch.Tensor:
    """A character corpus from a fixed word grammar, as token ids (26 letters, space, '.');
    with ``noise``, that share of its characters replaced by ones drawn at random."""
    g = torch.Generator().manual_seed(7)
    text, words = [], torch.randint(len(WORDS), (chars // 3,), generator=g).tolist()
    for i, w in enumerate(words):
        text.append(WORDS[w] + (". " if i % 7 == 6 else " "))
    ids = [ord(c) - 97 if c.isalpha() else 26 + (c == ".") for c in "".join(text)[:chars]]
    out = torch.tensor(ids, dtype=torch.long)
    if noise:
        flip = torch.rand(len(out), generator=g) < noise
        out = torch.where(flip, torch.randint(28, (len(out),), generator=g), out)
    return out


def batches(
    n: int, *, accumulation: int = 2, batch_size: int = 4, block_size: int = 16, noise: float = 0.0
):
    """``n`` steps' batches, each ``accumulation`` micro-batches of windows of the corpus at
    random offsets: (inputs, targets) of shape (accumulation, batch_size, block_size)."""
    data, g = corpus(noise=noise), torch.Generator().manual_seed(11)
    out = []
    for _ in range(n):
        at = torch.randint(len(data) - block_size - 1, (accumulation, batch_size), generator=g)
        x = torch.stack([torch.stack([data[i : i + block_size] for i in row]) for row in at])
        y = torch.stack(
            [torch.stack([data[i + 1 : i + 1 + block_size] for i in row]) for row in at]
        )
        out.append((x, y))
    return out


#: nanoGPT's schedule, scaled down: a linear warm-up, then cosine decay to a tenth.
LEARNING_RATE, WARMUP_ITERS, LR_DECAY_ITERS, MIN_LR = 1e-2, 20, 400, 1e-3


def get_lr(it: int) -> float:
    if it < WARMUP_ITERS:
        return LEARNING_RATE * (it + 1) / (WARMUP_ITERS + 1)
    if it > LR_DECAY_ITERS:
        return MIN_LR
    ratio = (it - WARMUP_ITERS) / (LR_DECAY_ITERS - WARMUP_ITERS)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LEARNING_RATE - MIN_LR)


class IterNum:
    """nanoGPT's ``iter_num``, which its learning rate is computed from, in an object with
    ``state_dict()``: given under ``schedulers``, a branch from a checkpoint restarts it where
    the checkpoint was taken."""

    def __init__(self):
        self.value = 0

    def state_dict(self):
        return {"iter_num": self.value}

    def load_state_dict(self, state):
        self.value = int(state["iter_num"])


def _ranks():
    """(rank, world size) of the process group the factory finds up, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _shard(data, rank, world):
    """Each rank's share of every batch's rows, as nanoGPT's ranks each draw their own: the
    global batch, and (DDP averaging the ranks' mean losses' gradients) the update, are one
    process's."""
    if world == 1:
        return data
    return [
        (x[:, rank::world].contiguous(), y[:, rank::world].contiguous(), *rest)
        for x, y, *rest in data
    ]


def _workload(data, *, record=None, ddp=True, all_reduce=False):
    """nanoGPT's training: on ranks (a process group up) each rank takes its share of the
    batches and, with ``ddp``, wraps the model in DistributedDataParallel, syncing the
    gradients on the last micro-batch only, as train.py does."""
    rank, world = _ranks()
    model = GPT(GPTConfig())
    optimizer = model.configure_optimizers(0.1, LEARNING_RATE, (0.9, 0.95))
    if world > 1 and ddp:
        model = nn.parallel.DistributedDataParallel(model)
    iter_num = IterNum()

    def step(model, batch, amp):
        xs, ys = batch[0], batch[1]
        if record is not None:
            record(int(batch[2]), iter_num.value)
        lr = get_lr(iter_num.value)
        for group in optimizer.param_groups:
            group["lr"] = lr
        total = 0.0
        for micro, (x, y) in enumerate(zip(xs, ys)):  # gradient accumulation
            if isinstance(model, nn.parallel.DistributedDataParallel):
                model.require_backward_grad_sync = micro == len(xs) - 1
            with amp.autocast():
                _, loss = model(x, y)
                loss = loss / len(xs)
            amp.backward(loss)
            total = total + loss.detach()
        if all_reduce and world > 1:  # the gradients averaged by hand, as DDP would
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        amp.step(optimizer)  # unscale, clip at clip_norm, step, update the scale
        optimizer.zero_grad(set_to_none=True)
        iter_num.value += 1
        return total

    return {
        "model": model,
        "optimizer": optimizer,
        "batches": _shard(data, rank, world),
        "step": step,
        "clip_norm": 1.0,
        "schedulers": [iter_num],
    }


def make_model():
    """nanoGPT's model, optimizer groups and train.py step, over 64 batches cycled; on ranks,
    under DistributedDataParallel."""
    return _workload(batches(64))


def make_noisy():
    """:func:`make_model` on a corpus 30% of whose characters are random, over 200 batches of
    16 windows: its loss keeps a floor of its own, as a language model's does, and falls
    slowly towards it for long. float32's target (10% above its loss at step 200) is reached
    near step 50 while the loss still falls clearly to step 190: the shape of a real GPT's
    loss early in training."""
    return _workload(batches(200, batch_size=16, noise=0.3))


def make_model_without_ddp():
    """:func:`make_model` whose ranks forget DistributedDataParallel: each trains a copy of
    its own on its share of the data, and the copies drift apart from the first step."""
    return _workload(batches(64), ddp=False)


def make_model_all_reduced():
    """:func:`make_model_without_ddp` whose step all-reduces the gradients itself: one model."""
    return _workload(batches(64), ddp=False, all_reduce=True)


#: Where :func:`make_recording` writes what each factory instance's step saw.
LOG_ENV = "SCALERTUNE_TEST_BATCH_LOG"


def make_recording():
    """:func:`make_model` over 1,024 numbered batches (a pass covers any run of the tests),
    whose step appends, per call, the factory instance, the batch's number and the step's
    ``iter_num`` to the file named by ``SCALERTUNE_TEST_BATCH_LOG`` (when set): one line per
    call, from every process the search starts."""
    path, instance = os.environ.get(LOG_ENV), uuid.uuid4().hex[:12]

    def record(index, iter_num):
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(f"{instance} {index} {iter_num}\n")

    numbered = [(x, y, torch.tensor(i)) for i, (x, y) in enumerate(batches(1024))]
    return _workload(numbered, record=record)


def read_log(path):
    """Each factory instance's (batch number, iter_num) pairs, in the order its step saw them."""
    seen = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            instance, index, iter_num = line.split()
            seen.setdefault(instance, []).append((int(index), int(iter_num)))
    return seen
