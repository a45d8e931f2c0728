"""Trace overhead: the float32 reference's step cost with the gradient trace recorded, against
the same run without it.

    python benchmarks/trace.py [--workloads gpt2 bert encoder codepoints] [--steps 600] [--pairs 3]

The float32 reference of a search records the trace the replay reads (``_run._trace``): every
tensor on the first ``TRACE_FULL_STEPS`` steps and one step in ``TRACE_FULL_EVERY`` after, the
subset of tensors that came close to the largest on the others. The budget is 5% per step of
the one run that records it. Each pair trains the workload's float32 reference twice, without
and with the collector, same seed, one after the other; each run's cost is its process CPU
time per step over the windows after ``TRACE_FULL_STEPS`` (what a long reference spends most
of its steps on, full steps one in 50 included), read at the training loop's own 10-step
window callback. The start-up probe (its first batches forward and backward, once per
reference) and the first full steps are reported apart, as a share of one run of
``--steps``. The figure is the median of the pairs' ratios, with their range. One torch
thread: CPU time then measures this run, not a second thread spinning.

The workloads are ``benchmarks/replay_calibration.py``'s: GPT-2 and BERT from their Hugging
Face config classes, ``nn.TransformerEncoder``, the shipped codepoints example.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]

import torch  # noqa: E402
from replay_calibration import WORKLOADS  # noqa: E402

from scalertune import _policy  # noqa: E402
from scalertune._amp._config import AmpConfig  # noqa: E402
from scalertune._run._loop import Plan, run_config  # noqa: E402
from scalertune._run._trace import TraceCollector  # noqa: E402

FLOAT32 = AmpConfig(dtype="float32")


def one_run(factory: Any, steps: int, traced: bool) -> dict[str, float]:
    """CPU seconds per step after the full-trace stretch, and CPU seconds before it (the
    probe, model building and the first full steps)."""
    marks: list[tuple[int, float]] = []
    started = time.process_time()

    def on_window(_record: Any, first: int) -> None:
        marks.append((first + _policy.READBACK_INTERVAL, time.process_time()))

    plan = Plan(watcher=TraceCollector(steps)) if traced else None
    run_config(factory, FLOAT32, steps=steps, seed=0, device=torch.device("cpu"),
               on_window=on_window, prune=False, plan=plan)
    late = [(s, t) for s, t in marks if s > _policy.TRACE_FULL_STEPS]
    (s0, t0), (s1, t1) = late[0], late[-1]
    early = next(t for s, t in marks if s == _policy.TRACE_FULL_STEPS) - started
    return {"per_step": (t1 - t0) / (s1 - s0), "early": early}


def measure(name: str, steps: int, pairs: int) -> dict[str, Any]:
    factory = WORKLOADS[name]
    one_run(factory, 2 * _policy.TRACE_FULL_STEPS, True)  # warm-up: imports, allocator
    ratios, early, plain_ms = [], [], []
    for _ in range(pairs):
        plain = one_run(factory, steps, False)
        traced = one_run(factory, steps, True)
        ratios.append(traced["per_step"] / plain["per_step"])
        early.append((traced["early"] - plain["early"]) / (plain["per_step"] * steps))
        plain_ms.append(plain["per_step"] * 1e3)
    return {"workload": name, "ms": statistics.median(plain_ms),
            "ratio": statistics.median(ratios), "low": min(ratios), "high": max(ratios),
            "early": statistics.median(early)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["gpt2", "bert", "encoder",
                                                           "codepoints"],
                        choices=sorted(WORKLOADS))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"Trace overhead on {platform.machine()}, {os.cpu_count()} cores (load "
          f"{os.getloadavg()[0]:.1f}), torch {torch.__version__}, one thread: the float32 "
          f"reference with the trace over without it, CPU time per step after step "
          f"{_policy.TRACE_FULL_STEPS}, median of {args.pairs} pairs of {args.steps}-step runs")
    print(f"   {'workload':<12} {'ms/step':>8} {'ratio':>7} {'(range)':<15} "
          f"probe and first {_policy.TRACE_FULL_STEPS} steps, as a share of one run")
    for name in args.workloads:
        r = measure(name, args.steps, args.pairs)
        print(f"   {r['workload']:<12} {r['ms']:>8.3f} {r['ratio']:>7.3f} "
              f"({r['low']:.3f}-{r['high']:.3f})  {100 * r['early']:>6.1f}%", flush=True)


if __name__ == "__main__":
    main()
