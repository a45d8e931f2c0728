"""Harness overhead: a scalertune trial's per-step cost against a hand-written AMP loop.

The hand-written loop is the one from the article this project started from (autocast
forward, scaled backward, scaler.step, scaler.update) with its loss logged every 10 steps,
as that article's loop does. The trial is the real training loop (``_run._loop.run_config``,
``AmpRuntime.train_step`` inside it) in runs of ``TRIAL_STEPS`` steps, as a search trains
them. Both run the same model, config, data and seed in one process, window by window: after
each 10-step window of the trial, its ``on_window`` callback runs one 10-step window of the
hand-written loop, so that neighbouring windows see the same machine.

Each window is timed by the process's CPU time (``time.process_time``: every thread's, so work
moved to a background thread still counts), which other jobs on a shared machine disturb far
less than wall time. A trial window costs what runs between two callbacks: its steps, the
read-back, the judging, the stop rule. The figure is the median of the paired per-window
ratios (trial over hand), and its spread the lowest and highest median of ten consecutive
blocks of windows: how much the estimate moves as the machine's load does. The first window
of every run (allocator and autocast warm-up) is left out on both sides.

Torch runs one intra-op thread here (``threads``): with two on a 2-core machine, the second
spins while the first runs Python, and how long it spins depends on the other jobs' load, so
CPU time would measure the neighbours. The per-step work of both loops is the same either way.

A second pass runs the trial as a search does, with its stop rule and its curve written to a
SQLite study (the default storage) by the background writer; the writer thread's CPU time is
charged to the trial even when it runs during the hand-written window. Host syncs are counted
in a separate short pass, as the counting wrappers cost time themselves.

A control pass pairs the hand-written loop with a twin of itself, built after it as the
trial's model is, through the same windows: the same code on both sides, so its ratio and
spread say how far two identical loops read apart on this machine (their tensors' places in
memory differ). A trial ratio inside the control's spread is a tie.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from scalertune import AmpConfig
from scalertune._judge._stopping import StopRule
from scalertune._judge._target import Target
from scalertune._run._loop import run_config

WINDOW = 10
CONFIG = AmpConfig(dtype="float16", init_scale=4096.0)
#: A trial's length in the default search: runs are this long, each with a fresh workload.
TRIAL_STEPS = 200
#: Consecutive blocks whose medians make the spread.
BLOCKS = 10


def tiny() -> dict[str, Any]:
    """The codepoints MLP's size: 580 parameters, where Python overhead shows most."""
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 4))
    batches = [(torch.randn(16, 4), torch.randn(16, 4)) for _ in range(8)]
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "loss_fn": nn.MSELoss(),
        "batches": batches,
    }


def mid() -> dict[str, Any]:
    """An MLP of 0.23M parameters on batches of 64: float16 on a CPU makes each step a few
    milliseconds already."""
    model = nn.Sequential(
        nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 128)
    )
    batches = [(torch.randn(64, 128), torch.randn(64, 128)) for _ in range(8)]
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=1e-3),
        "loss_fn": nn.MSELoss(),
        "batches": batches,
    }


def hand_written(factory: Callable[[], dict[str, Any]], device: torch.device) -> Iterator[None]:
    """The seed article's loop, one 10-step window per ``next()`` (after a first ``next()``
    that builds the model, so that no window pays for it)."""
    torch.manual_seed(0)
    w = factory()
    model, optimizer, loss_fn = w["model"].to(device), w["optimizer"], w["loss_fn"]
    scaler = torch.amp.GradScaler(device.type, init_scale=CONFIG.init_scale)
    step = 0
    yield
    while True:
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
                yield


class _Pairs:
    """The paired windows of one comparison: CPU and wall seconds per step, trial and hand."""

    def __init__(self) -> None:
        self.ours: list[tuple[float, float]] = []
        self.hand: list[tuple[float, float]] = []

    def summary(self, which: int = 0) -> dict[str, float]:
        ratios = [o[which] / h[which] for o, h in zip(self.ours, self.hand)]
        size = max(1, len(ratios) // BLOCKS)
        blocks = [
            statistics.median(ratios[i : i + size]) for i in range(0, len(ratios) - size + 1, size)
        ]
        return {
            "ratio": statistics.median(ratios),
            "low": min(blocks),
            "high": max(blocks),
            "ours_ms": statistics.median(o[which] for o in self.ours) * 1e3,
            "hand_ms": statistics.median(h[which] for h in self.hand) * 1e3,
        }


def interleaved(
    factory: Callable[[], dict[str, Any]],
    device: torch.device,
    *,
    windows: int,
    as_searched: bool = False,
    control: bool = False,
) -> _Pairs:
    """``windows`` pairs of windows, trial then hand-written, in runs of ``TRIAL_STEPS``;
    ``as_searched``: the trial with its stop rule and its curve written to a SQLite study;
    ``control``: a second hand-written loop in the trial's place, the same code on both
    sides, so that its ratio is the pairing's own resolution."""
    pairs = _Pairs()
    with contextlib.ExitStack() as stack:
        study = _sqlite_study(stack) if as_searched else None
        while len(pairs.ours) < windows:
            reports = _reports(study) if study is not None else None
            try:
                _one_run(factory, device, pairs, windows, reports, control=control)
            finally:
                if reports is not None:
                    reports.close()
    return pairs


def _one_run(
    factory: Callable[[], dict[str, Any]],
    device: torch.device,
    pairs: _Pairs,
    windows: int,
    reports: Any,
    *,
    control: bool = False,
) -> None:
    hand = hand_written(factory, device)
    next(hand)
    # The writer thread's CPU time, read wherever it ran, is the trial's.
    writer = (
        time.pthread_getcpuclockid(reports._thread.ident)  # noqa: SLF001
        if reports is not None
        else None
    )
    writer_cpu = (lambda: time.clock_gettime(writer)) if writer is not None else (lambda: 0.0)
    last = {"cpu": 0.0, "wall": 0.0, "first": True}

    def on_window(record: Any, start: int) -> None:
        if reports is not None:
            reports.window(record, start)
        cpu, wall = time.process_time(), time.perf_counter()
        ours = (cpu - last["cpu"], wall - last["wall"])
        c0, w0, k0 = time.process_time(), time.perf_counter(), writer_cpu()
        next(hand)
        k1 = writer_cpu()
        hand_time = (time.process_time() - c0 - (k1 - k0), time.perf_counter() - w0)
        if not last["first"] and len(pairs.ours) < windows:
            pairs.ours.append(((ours[0] + k1 - k0) / WINDOW, ours[1] / WINDOW))
            pairs.hand.append((hand_time[0] / WINDOW, hand_time[1] / WINDOW))
        last.update(cpu=time.process_time(), wall=time.perf_counter(), first=False)

    if control:  # the hand-written loop's twin, built after it as the trial's model is
        twin = hand_written(factory, device)
        next(twin)
        for _ in range(TRIAL_STEPS // WINDOW):
            next(twin)
            on_window(None, 0)
        return
    # A target no run reaches, so that the stop rule judges every window and stops none.
    stop = (
        StopRule(Target(loss=1e-9, reference_final=1.0, reference_start=2.0))
        if reports is not None
        else None
    )
    run_config(
        factory, CONFIG, steps=TRIAL_STEPS, seed=0, device=device, on_window=on_window, stop=stop
    )


def _sqlite_study(stack: contextlib.ExitStack) -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    folder = stack.enter_context(tempfile.TemporaryDirectory())
    return optuna.create_study(storage=f"sqlite:///{os.path.join(folder, 'overhead.db')}")


def _reports(study: Any) -> Any:
    from scalertune._search._reports import Reports

    return Reports(study.ask(), Target(loss=1e-9, reference_final=1.0, reference_start=2.0))


@contextlib.contextmanager
def counting_syncs() -> Iterator[dict[str, int]]:
    """Count the calls that make the host wait for the device."""
    counts = {"n": 0}
    patched = [
        (torch.Tensor, "item"),
        (torch.Tensor, "cpu"),
        (torch.Tensor, "tolist"),
        (torch.Tensor, "__bool__"),
        (torch.cuda, "synchronize"),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name in patched]

    def wrap(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
            # tolist() of a tensor already on the host waits for nothing
            if not (
                name == "tolist"
                and tensor is not None
                and tensor.device.type == "cpu"
                and not torch.cuda.is_available()
            ):
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


def syncs_per_step(
    factory: Callable[[], dict[str, Any]], device: torch.device, steps: int = 100
) -> tuple[float, float]:
    """Host syncs per step: the hand-written loop's, the trial's as it runs on an accelerator
    (on a CPU the trial reads each step's loss and scale with ``item()``, which waits for
    nothing there; counted that way it would look like two syncs per step)."""
    hand = hand_written(factory, device)
    next(hand)
    with counting_syncs() as c:
        for _ in range(steps // WINDOW):
            next(hand)
    hand_n = c["n"]
    with counting_syncs() as c, accelerator_readings():
        run_config(factory, CONFIG, steps=steps, seed=0, device=device)
    return hand_n / steps, c["n"] / steps


@contextlib.contextmanager
def accelerator_readings() -> Iterator[None]:
    from scalertune._run import _loop

    before, _loop.HOST_READS = _loop.HOST_READS, ()
    try:
        yield
    finally:
        _loop.HOST_READS = before


def measure(
    device: torch.device,
    *,
    windows: int = 5000,
    threads: int = 1,
    searched_windows: int | None = None,
) -> list[dict[str, Any]]:
    """One row per model: CPU ms per step of each loop, the ratio with its block spread, the
    wall-time ratio, the ratio of the trial as searched (``searched_windows`` pairs, a fifth
    of ``windows`` by default; 0 for none), the control's ratio (the hand-written loop over
    its twin, ``windows`` pairs: a trial ratio inside its spread is a tie), and host syncs
    per step."""
    searched_windows = windows // 5 if searched_windows is None else searched_windows
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    rows = []
    try:
        for name, factory in (("tiny (580 params)", tiny), ("mid (0.23M params)", mid)):
            cpu = interleaved(factory, device, windows=windows)
            twin = interleaved(factory, device, windows=windows, control=True).summary(0)
            row = {
                "model": name,
                **cpu.summary(0),
                "wall_ratio": cpu.summary(1)["ratio"],
                "windows": windows,
                "control_ratio": twin["ratio"],
                "control_low": twin["low"],
                "control_high": twin["high"],
            }
            if searched_windows:
                searched = interleaved(
                    factory, device, windows=searched_windows, as_searched=True
                ).summary(0)
                row.update(
                    searched_ratio=searched["ratio"],
                    searched_low=searched["low"],
                    searched_high=searched["high"],
                )
            row["hand_syncs"], row["ours_syncs"] = syncs_per_step(factory, device)
            rows.append(row)
    finally:
        torch.set_num_threads(before)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--windows", type=int, default=5000)
    parser.add_argument("--searched-windows", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(
        f"{CONFIG.describe()}; process CPU time per step, median of paired 10-step windows "
        f"(spread: lowest-highest median of {BLOCKS} blocks), {args.threads} torch thread(s)"
    )
    for r in measure(
        torch.device(args.device),
        windows=args.windows,
        threads=args.threads,
        searched_windows=args.searched_windows,
    ):
        searched = (
            f"; as searched (SQLite writer) {r['searched_ratio']:.3f}x "
            f"({r['searched_low']:.3f}-{r['searched_high']:.3f})"
            if "searched_ratio" in r
            else ""
        )
        print(
            f"{r['model']:<20} hand {r['hand_ms']:.3f} ms, trial {r['ours_ms']:.3f} ms: "
            f"{r['ratio']:.3f}x ({r['low']:.3f}-{r['high']:.3f}; wall {r['wall_ratio']:.3f}x)"
            f"{searched}; syncs/step {r['hand_syncs']:.2f} vs {r['ours_syncs']:.2f}"
        )
        print(
            f"{'':<20} control, the hand-written loop over its twin: {r['control_ratio']:.3f}x "
            f"({r['control_low']:.3f}-{r['control_high']:.3f})"
        )
