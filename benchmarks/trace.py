"""Trace overhead: the float32 reference's step cost with the gradient trace recorded, against
the same run without it.

    python benchmarks/trace.py [--workloads gpt2 ...] [--steps 600] [--pairs 3] [--horizon N]

The float32 reference of a search records the trace the replay reads
(``_run._trace_collector``): every tensor on the first ``TRACE_FULL_STEPS`` steps and one step
in ``TRACE_FULL_EVERY`` after, the subset of tensors that came close to the largest on the
others. The budget is 5% per step of
the one run that records it. Each pair trains the workload's float32 reference twice, without
and with the collector, same seed, one after the other. After each 10-step window of either,
the training loop's window callback runs one window of a hand-written float32 loop of the same
workload (the yardstick), so that neighbouring windows see the same machine; a run's cost is
its CPU time over the yardstick's, summed over the windows after ``TRACE_FULL_STEPS`` (what a
long reference spends most of its steps on, the full steps among them), and the figure is the
traced run's cost over the plain run's: the median of the pairs, with their range. The start-up
probe (its first batches forward and backward, once per reference) and the first full steps are
reported apart, as a share of one run of ``--steps``. One torch thread: CPU time then measures
this run, not a second thread spinning.

The workloads are ``benchmarks/replay_calibration.py``'s: GPT-2 and BERT from their Hugging
Face config classes, ``nn.TransformerEncoder``, the shipped codepoints example.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]

import torch  # noqa: E402
from replay_calibration import WORKLOADS  # noqa: E402

from scalertune import _policy  # noqa: E402
from scalertune._amp._config import AmpConfig  # noqa: E402
from scalertune._run import _policy as _run_policy  # noqa: E402
from scalertune._run._loop import Plan, run_config  # noqa: E402
from scalertune._run._trace_collector import TraceCollector, full_every  # noqa: E402

FLOAT32 = AmpConfig(dtype="float32")


def yardstick(factory: Any) -> Iterator[None]:
    """A hand-written float32 loop of the same workload: one 10-step window per ``next()``,
    run between the measured run's windows so that both see the same machine."""
    torch.manual_seed(1)
    parts = factory()
    model, optimizer, loss_fn = parts["model"], parts["optimizer"], parts.get("loss_fn")
    step = parts.get("step")
    yield
    while True:
        for batch in parts["batches"]:
            for _ in range(_policy.READBACK_INTERVAL):
                optimizer.zero_grad(set_to_none=True)
                if step is not None:
                    step(model, batch, NoScaler())
                else:
                    loss_fn(model(batch[0]), batch[1]).backward()
                    optimizer.step()
            yield


class NoScaler:
    """What a workload's own ``step`` calls in the yardstick: plain backward and step."""

    def autocast(self) -> Any:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()


def one_run(factory: Any, steps: int, traced: bool, horizon: int = 0) -> dict[str, float]:
    """The run's CPU time over the yardstick's, summed over the paired windows after
    ``TRACE_FULL_STEPS``; and the CPU seconds before them (the probe, model building and the
    first full steps)."""
    stick = yardstick(factory)
    next(stick)
    ours, theirs = [0.0], [0.0]
    last = {"cpu": time.process_time()}
    started = last["cpu"]
    early = {}

    def on_window(_record: Any, first: int) -> None:
        now = time.process_time()
        end = first + _policy.READBACK_INTERVAL
        if end == _run_policy.TRACE_FULL_STEPS:
            early["s"] = now - started
        c0 = time.process_time()
        next(stick)
        if end > _run_policy.TRACE_FULL_STEPS:
            ours[0] += now - last["cpu"]
            theirs[0] += time.process_time() - c0
        last["cpu"] = time.process_time()

    plan = Plan(watcher=TraceCollector(max(steps, horizon))) if traced else None
    run_config(
        factory,
        FLOAT32,
        steps=steps,
        seed=0,
        device=torch.device("cpu"),
        on_window=on_window,
        prune=False,
        plan=plan,
    )
    return {"ratio": ours[0] / theirs[0], "per_step": ours[0] / (steps - 100), "early": early["s"]}


def measure(name: str, steps: int, pairs: int, horizon: int = 0) -> dict[str, Any]:
    factory = WORKLOADS[name]
    one_run(factory, 2 * _run_policy.TRACE_FULL_STEPS, True)  # warm-up: imports, allocator
    ratios, early, plain_ms = [], [], []
    for _ in range(pairs):
        plain = one_run(factory, steps, False)
        traced = one_run(factory, steps, True, horizon)
        ratios.append(traced["ratio"] / plain["ratio"])
        early.append((traced["early"] - plain["early"]) / (plain["per_step"] * steps))
        plain_ms.append(plain["per_step"] * 1e3)
    return {
        "workload": name,
        "ms": statistics.median(plain_ms),
        "ratio": statistics.median(ratios),
        "low": min(ratios),
        "high": max(ratios),
        "early": statistics.median(early),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=["gpt2", "bert", "encoder", "codepoints"],
        choices=sorted(WORKLOADS),
    )
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--horizon", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"Trace overhead on {platform.machine()}, {os.cpu_count()} cores (load "
        f"{os.getloadavg()[0]:.1f}), torch {torch.__version__}, one thread: the float32 "
        f"reference with the trace over without it, CPU time per step after step "
        f"{_run_policy.TRACE_FULL_STEPS}, median of {args.pairs} pairs of {args.steps}-step runs"
        + (
            f", the collector told a horizon of {args.horizon:,} (one full step in "
            f"{full_every(args.horizon)})"
            if args.horizon
            else ""
        )
    )
    print(
        f"   {'workload':<12} {'ms/step':>8} {'ratio':>7} {'(range)':<15} "
        f"probe and first {_run_policy.TRACE_FULL_STEPS} steps, as a share of one run"
    )
    for name in args.workloads:
        r = measure(name, args.steps, args.pairs, args.horizon)
        print(
            f"   {r['workload']:<12} {r['ms']:>8.3f} {r['ratio']:>7.3f} "
            f"({r['low']:.3f}-{r['high']:.3f})  {100 * r['early']:>6.1f}%",
            flush=True,
        )


if __name__ == "__main__":
    main()
