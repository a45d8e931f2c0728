"""float8 searched, then trained to the horizon: what the answer of ``--space float8`` does
against torchao's default recipe and float32, on three workloads.

    python benchmarks/float8.py [--quick] [--seeds 0 1 2] [--only massive growing gpt]
                                [--device cpu|cuda]

- ``massive``: ``tests/float8_workloads.py:make_model``, one row in 16 carries a value of 1e6
  from the first step (an attention sink, an outlier channel): a scale per tensor flushes the
  ordinary values to zero; trained to step 1000.
- ``growing``: ``make_growing``, the same value grown from 1 to 1e6 over 3000 steps: a
  200-step search sees no outlier yet; trained to step 3000.
- ``gpt``: a small GPT with nn.Linear layers (nanoGPT's layout, written here: 2 layers,
  width 64, 4 heads, 256 byte tokens, sequences of 64) on a character corpus drawn from a
  fixed word grammar (no download), no outlier; trained to step 1000. Not Hugging Face's
  ``GPT2LMHeadModel`` from a ``GPT2Config`` of the same sizes: its attention and MLP are
  ``Conv1D`` layers, which torchao's float8 conversion does not take, so only its tied
  ``lm_head`` would train in float8.

Each workload: ``scalertune.search(space="float8", steps=200)`` on the CPU, its YAML written;
then, from the same seed and batches, float32, torchao's default recipe
(``AmpConfig(dtype="float8")``), and the search's best AMP config loaded as training code loads
it (``scalertune.load(path, best_amp=True, device="cpu")``), with its in-run check and with
``check=False``. The figure is each run's loss over float32's of the same seed at the horizon
(the mean of the last 100 steps' losses), median and range over the seeds; float32's own
losses over the seeds show the noise. On a CPU torchao emulates float8: float8's numerics,
about 4x float32's step time here; no speed is claimed.

``--quick`` (about a minute): searches of 100 steps, seed 0 only, horizons of 300 steps, and
an outlier grown over 600 steps, held to step 1200.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: The small GPT's sizes: what a GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256,
#: n_positions=64) holds.
VOCAB, BLOCK, WIDTH, HEADS, LAYERS, BATCH = 256, 64, 64, 4, 2, 8
#: The GPT's batches: enough for its longest horizon.
GPT_STEPS = 1000
WORDS = ["the", "a", "one", "two", "cat", "dog", "sat", "ran", "on", "under", "mat", "log"]
WORDS += ["and", "then", "big", "small", "red"]


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.c_proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            u.view(b, t, HEADS, c // HEADS).transpose(1, 2)
            for u in self.c_attn(x).split(WIDTH, dim=2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(WIDTH), _Attention()
        self.ln_2 = nn.LayerNorm(WIDTH)
        self.c_fc, self.c_proj = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2's layout with nn.Linear layers; the token embedding tied to ``lm_head`` (float8
    keeps the tie: the converted layer holds the same parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(BLOCK, WIDTH)
        self.h = nn.ModuleList(_Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def _gpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))


def _corpus() -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    words = torch.randint(len(WORDS), (20000,), generator=g).tolist()
    text = " ".join(WORDS[i] + ("." if n % 7 == 6 else "") for n, i in enumerate(words))
    return torch.tensor(list(text.encode()), dtype=torch.long)


def make_gpt() -> dict[str, Any]:
    """The small GPT, AdamW at 3e-3, ``GPT_STEPS`` batches of 8 windows of 64 bytes."""
    data, g = _corpus(), torch.Generator().manual_seed(11)
    batches = []
    for _ in range(GPT_STEPS):
        at = torch.randint(len(data) - BLOCK - 1, (BATCH,), generator=g).tolist()
        x = torch.stack([data[i : i + BLOCK] for i in at])
        y = torch.stack([data[i + 1 : i + 1 + BLOCK] for i in at])
        batches.append((x, y))
    model = GPT()
    return {
        "model": model,
        "optimizer": torch.optim.AdamW(model.parameters(), lr=3e-3),
        "loss_fn": _gpt_loss,
        "batches": batches,
    }


def growing_quick() -> dict[str, Any]:
    """``--quick``'s growing outlier: from 1 to 1e6 over 600 steps, then held to step 1200
    (the check compares its last 5 checks, 100 steps apart: a run that ends as the outlier
    peaks leaves it no time to act)."""
    workloads = _float8_workloads()
    return workloads.workload(1200, lambda step: workloads.MASSIVE ** min(1.0, step / 599))


def _float8_workloads() -> Any:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    try:
        import float8_workloads
    finally:
        sys.path.pop(0)
    return float8_workloads


#: name -> (factory spec, horizon), and with --quick
WORKLOADS = {
    "massive": (os.path.join(ROOT, "tests", "float8_workloads.py:make_model"), 1000),
    "growing": (os.path.join(ROOT, "tests", "float8_workloads.py:make_growing"), 3000),
    "gpt": (os.path.join(HERE, "float8.py:make_gpt"), 1000),
}
QUICK = {
    "massive": (WORKLOADS["massive"][0], 300),
    "growing": (os.path.join(HERE, "float8.py:growing_quick"), 1200),
    "gpt": (WORKLOADS["gpt"][0], 300),
}


def _factory(spec: str) -> Any:
    path, name = spec.rsplit(":", 1)
    if path.endswith("float8_workloads.py"):
        return getattr(_float8_workloads(), name)
    return globals()[name]


def _train(
    factory: Any, steps: int, seed: int, make_amp: Any, device: str
) -> tuple[float, float, Any, list]:
    """Mean loss of the last 100 of ``steps`` steps, ms per step, the runtime, and what its
    check said."""
    import scalertune

    torch.manual_seed(seed)
    parts = factory()
    amp = make_amp()
    model = amp.prepare(parts["model"].to(device))  # the optimizer keeps the same parameters
    optimizer, loss_fn = parts["optimizer"], parts["loss_fn"]
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        started = time.perf_counter()
        for x, y in parts["batches"][:steps]:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad(set_to_none=True)
            loss = amp.loss(lambda x=x, y=y: loss_fn(model(x), y))
            amp.backward(loss)
            amp.step(optimizer)
            losses.append(float(loss.detach()))
        ms = (time.perf_counter() - started) / steps * 1e3
    said = [str(w.message) for w in caught if issubclass(w.category, scalertune.AmpCheckWarning)]
    return sum(losses[-100:]) / len(losses[-100:]), ms, amp, said


def _search(spec: str, folder: str, steps: int, device: str) -> tuple[str, dict[str, Any]]:
    import scalertune

    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = scalertune.search(
            spec,
            storage=f"sqlite:///{folder}/f8.db",
            space="float8",
            steps=steps,
            device=device,
            artifact_dir=folder,
        )
    path = os.path.join(folder, "amp.yaml")
    result.to_yaml(path)
    default = result.baselines.get("torchao-default")
    return path, {
        "wall_s": time.perf_counter() - started,
        "run_equivalents": result.steps_trained / steps,
        "answer": result.config.describe(),
        "best_amp": None if result.best_amp is None else result.best_amp.config.describe(),
        "default": None
        if default is None
        else (
            f"reached the target at step {default.steps_to_target}"
            if default.steps_to_target is not None
            else "never reached the target"
        ),
    }


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}x"
    return f"{statistics.median(values):.3f}x ({min(values):.3f}-{max(values):.3f})"


def measure(name: str, seeds: list[int], quick: bool, device: str) -> None:
    import scalertune
    from scalertune import AmpConfig, AmpRuntime

    spec, horizon = (QUICK if quick else WORKLOADS)[name]
    steps = 100 if quick else 200
    factory = _factory(spec)
    with tempfile.TemporaryDirectory() as folder:
        path, searched = _search(spec, folder, steps, device)
        print(
            f"{name}: search --space float8 --steps {steps}: {searched['run_equivalents']:.1f} "
            f"run-eq, {searched['wall_s']:.0f} s; answer {searched['answer']}; best AMP "
            f"{searched['best_amp']}; torchao-default {searched['default']}"
        )
        if searched["best_amp"] is None:
            print("  no best AMP config held: nothing to load")
            return
        runs: dict[str, list[tuple[float, float, list]]] = {}
        makers = {
            "float32": lambda: AmpRuntime(AmpConfig(dtype="float32"), device=device),
            "torchao default": lambda: AmpRuntime(AmpConfig(dtype="float8"), device=device),
            "answer, checked": lambda: scalertune.load(
                path, best_amp=True, device=device, storage=False
            ),
            "answer, check=False": lambda: scalertune.load(
                path, best_amp=True, device=device, check=False, storage=False
            ),
        }
        ended = {}
        for seed in seeds:
            for label, make in makers.items():
                loss, ms, amp, said = _train(factory, horizon, seed, make, device)
                runs.setdefault(label, []).append((loss, ms, said))
                if label == "answer, checked":
                    ended[seed] = amp.config.describe()
    float32 = [r[0] for r in runs["float32"]]
    print(
        f"  horizon {horizon} steps, seeds {', '.join(map(str, seeds))}; float32's loss "
        f"{', '.join(f'{v:.4f}' for v in float32)} (spread {max(float32) / min(float32):.3f}x)"
    )
    print(f"  {'run':<21} {'loss / float32 at the horizon':<32} {'ms/step':>8}")
    for label, rows in runs.items():
        ratios = [r[0] / f for r, f in zip(rows, float32, strict=True)]
        ms = statistics.median(r[1] for r in rows)
        print(f"  {label:<21} {_spread(ratios):<32} {ms:>8.2f}")
    for seed, (_, _, said) in zip(seeds, runs["answer, checked"], strict=True):
        print(f"  seed {seed} checked: ended {ended[seed]}; " + ("; ".join(said) or "(nothing)"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short horizons, searches of 100")
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--only", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (float8 matmuls: 8.9+)")
    args = parser.parse_args()
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    torch.set_num_threads(1)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    if args.device == "cpu":
        where = "float8 emulated on the CPU by torchao"
    else:
        where = f"{torch.cuda.get_device_name(args.device)}, capability " + ".".join(
            map(str, torch.cuda.get_device_capability(args.device))
        )
    print(f"torch {torch.__version__}, one thread; {where}")
    for name in args.only:
        measure(name, seeds, args.quick, args.device)


if __name__ == "__main__":
    main()
