"""What the in-run check costs a run where nothing goes wrong, against a plain GradScaler loop.

    python benchmarks/inrun_check.py [--workloads tiny gpt2 bert encoder] [--steps 2000]

Each workload is trained twice, side by side in one process: the user's own AMP loop
(autocast forward, ``scaler.scale(loss).backward()``, ``scaler.step``, ``scaler.update``, a
plain ``torch.amp.GradScaler``) and the same steps through a runtime built as
``scalertune.load`` builds it (guard, watch and the in-run check at its default cadence of a
float32 forward every 100 steps), ``amp.train_step`` for a loss function, ``amp.loss`` for a
model that computes its own loss. The two alternate window by window (10 steps each), and
each window is timed by the process's CPU time, which other jobs on a shared machine disturb
far less than wall time. The check's cost comes in one step of every hundred, so the figure
is not a median of windows but the ratio of the two loops' CPU time over each block of 100
steps: the median over blocks, and the lowest and highest block.

Torch runs one intra-op thread (as in ``overhead.py``: a second would spin while the first
runs Python, and measure the neighbours).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import replay_calibration  # noqa: E402

from scalertune import AmpConfig, AmpRuntime, Guard  # noqa: E402
from scalertune._amp._watch import ScalerPrediction, Watch  # noqa: E402
from scalertune._inrun import InRunCheck  # noqa: E402

WINDOW = 10
BLOCK = 100
CONFIG = AmpConfig(init_scale=2.0**10, growth_interval=2000)


def tiny() -> dict[str, Any]:
    """The codepoints MLP's size (580 parameters): where per-step Python shows most."""
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 4))
    batches = [(torch.randn(16, 4), torch.randn(16, 4)) for _ in range(8)]
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "loss_fn": nn.MSELoss(),
        "batches": batches,
    }


def gpt2() -> dict[str, Any]:
    w = replay_calibration.gpt2()
    return {**w, "loss": lambda m, b: m(input_ids=b, labels=b).loss}


def bert() -> dict[str, Any]:
    w = replay_calibration.bert()
    return {**w, "loss": lambda m, b: m(input_ids=b[0], labels=b[1]).loss}


WORKLOADS: dict[str, Callable[[], dict[str, Any]]] = {
    "tiny": tiny,
    "gpt2": gpt2,
    "bert": bert,
    "encoder": replay_calibration.encoder,
}


def _loss(w: dict[str, Any], model: nn.Module, batch: Any) -> torch.Tensor:
    if "loss" in w:
        return w["loss"](model, batch)
    x, y = batch
    return w["loss_fn"](model(x), y)


def plain(factory: Callable[[], dict[str, Any]]) -> Iterator[None]:
    """The user's own GradScaler loop, one window per ``next()``."""
    torch.manual_seed(0)
    w = factory()
    model, optimizer = w["model"], w["optimizer"]
    scaler = torch.amp.GradScaler("cpu", init_scale=CONFIG.init_scale)
    yield
    step = 0
    while True:
        for batch in w["batches"]:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = _loss(w, model, batch)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
            if step % WINDOW == 0:
                yield


def checked(factory: Callable[[], dict[str, Any]]) -> Iterator[None]:
    """The same steps through a runtime that checks itself, as ``scalertune.load`` builds it."""
    torch.manual_seed(0)
    w = factory()
    prediction = ScalerPrediction(
        horizon=200, skipped_steps=0, min_scale=2.0**8, final_scale=2.0**10
    )
    amp = AmpRuntime(
        CONFIG, device="cpu", guard=Guard(), watch=Watch(prediction), check=InRunCheck()
    )
    model, optimizer = amp.prepare(w["model"]), w["optimizer"]
    yield
    step = 0
    while True:
        for batch in w["batches"]:
            if "loss" in w:
                optimizer.zero_grad(set_to_none=True)
                loss = amp.loss(lambda b=batch: w["loss"](model, b))
                amp.backward(loss)
                amp.step(optimizer)
            else:
                amp.train_step(model, optimizer, w["loss_fn"], batch)
            step += 1
            if step % WINDOW == 0:
                yield
        if step >= 10**9:
            break
    assert not amp.check.actions.done  # nothing goes wrong: a cost, not an action


def compare(name: str, steps: int) -> dict[str, float]:
    factory = WORKLOADS[name]
    ours, theirs = checked(factory), plain(factory)
    next(ours), next(theirs)
    mine, hand = [], []
    for i in range(steps // WINDOW):
        for gen, times in (
            ((ours, mine), (theirs, hand)) if i % 2 else ((theirs, hand), (ours, mine))
        ):
            start = time.process_time()
            next(gen)
            times.append(time.process_time() - start)
    per = BLOCK // WINDOW
    ratios = [
        sum(mine[i : i + per]) / sum(hand[i : i + per]) for i in range(0, len(mine) - per + 1, per)
    ]
    return {
        "ratio": statistics.median(ratios),
        "low": min(ratios),
        "high": max(ratios),
        "total": sum(mine) / sum(hand),
        "hand_ms": sum(hand) / len(hand) / WINDOW * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"{'workload':<8} {'plain ms/step':>13} {'checked/plain':>13} {'blocks of 100 steps':>21}"
    )
    for name in args.workloads:
        r = compare(name, args.steps)
        print(
            f"{name:<8} {r['hand_ms']:>13.3f} {r['total']:>12.3f}x "
            f"{r['ratio']:>8.3f}x ({r['low']:.3f}-{r['high']:.3f})"
        )


if __name__ == "__main__":
    main()
