"""Harness overhead: a scalertune trial's step time against a hand-written AMP loop.

The hand-written loop is the one from the article this project started from (autocast
forward, scaled backward, scaler.step, scaler.update) with its loss logged every 10 steps,
as that article's loop does. Both run the same model, config, data and seed, interleaved in
one process, and both are timed the same way: wall time per 10-step window, median over
windows after the first. Host syncs are counted by wrapping the calls that make one.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any, Callable, Iterator

import torch
from torch import nn

from scalertune import AmpConfig
from scalertune._run._loop import run_config

WINDOW = 10
CONFIG = AmpConfig(dtype="float16", init_scale=4096.0)


def tiny() -> dict[str, Any]:
    """The codepoints MLP's size: 580 parameters, where Python overhead shows most."""
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 4))
    batches = [(torch.randn(16, 4), torch.randn(16, 4)) for _ in range(8)]
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
            "loss_fn": nn.MSELoss(), "batches": batches}


def mid() -> dict[str, Any]:
    """An MLP of 0.2M parameters on batches of 64: float16 on an AVX2 CPU makes each step
    tens of milliseconds already."""
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                          nn.Linear(256, 128))
    batches = [(torch.randn(64, 128), torch.randn(64, 128)) for _ in range(8)]
    return {"model": model, "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
            "loss_fn": nn.MSELoss(), "batches": batches}


def hand_written(factory: Callable[[], dict[str, Any]], steps: int,
                 device: torch.device) -> list[float]:
    """The seed article's loop; returns seconds per step of each 10-step window."""
    torch.manual_seed(0)
    w = factory()
    model, optimizer, loss_fn = w["model"].to(device), w["optimizer"], w["loss_fn"]
    scaler = torch.amp.GradScaler(device.type, init_scale=CONFIG.init_scale)
    times, started, step = [], time.perf_counter(), 0
    while step < steps:
        for x, y in w["batches"]:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.float16):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            step += 1
            if step % WINDOW == 0:
                loss.item()  # the article logs the loss every 10 steps
                now = time.perf_counter()
                times.append((now - started) / WINDOW)
                started = now
            if step == steps:
                break
    return times


def harness(factory: Callable[[], dict[str, Any]], steps: int, device: torch.device) -> list[float]:
    record = run_config(factory, CONFIG, steps=steps, seed=0, device=device)
    return record.window_step_times


@contextlib.contextmanager
def counting_syncs() -> Iterator[dict[str, int]]:
    """Count the calls that make the host wait for the device."""
    counts = {"n": 0}
    patched = [(torch.Tensor, "item"), (torch.Tensor, "cpu"), (torch.Tensor, "tolist"),
               (torch.Tensor, "__bool__"), (torch.cuda, "synchronize")]
    originals = [(owner, name, getattr(owner, name)) for owner, name in patched]

    def wrap(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
            # tolist() of a tensor already on the host waits for nothing
            if not (name == "tolist" and tensor is not None and tensor.device.type == "cpu"
                    and not _device_is_cuda()):
                counts["n"] += 1
            return fn(*args, **kwargs)
        return counted

    for owner, name, fn in originals:
        setattr(owner, name, wrap(fn, name))
    try:
        yield counts
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)


def _device_is_cuda() -> bool:
    return torch.cuda.is_available()


def measure(device: torch.device, *, steps: int = 100, repeats: int = 3) -> list[dict[str, Any]]:
    rows = []
    for name, factory in (("tiny (580 params)", tiny), ("mid (0.23M params)", mid)):
        hand_times, ours_times = [], []
        hand_sync = ours_sync = 0.0
        for _ in range(repeats):  # interleaved, so drift hits both alike
            with counting_syncs() as c:
                hand_times += hand_written(factory, steps, device)[1:]
            hand_sync = c["n"] / steps
            with counting_syncs() as c:
                ours_times += harness(factory, steps, device)[1:]
            ours_sync = c["n"] / steps
        hand, ours = statistics.median(hand_times), statistics.median(ours_times)
        rows.append({"model": name, "hand_ms": hand * 1e3, "ours_ms": ours * 1e3,
                     "ratio": ours / hand, "hand_syncs": hand_sync, "ours_syncs": ours_sync})
    return rows


if __name__ == "__main__":
    for row in measure(torch.device("cuda" if torch.cuda.is_available() else "cpu")):
        print(row)
