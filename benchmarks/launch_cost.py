"""What starting a run's processes costs, forked from the server against spawned:
python benchmarks/launch_cost.py [--rounds 6] [--steps 5]

Each round times one run of ``tests/workloads.py:healthy`` (float32, ``--steps`` steps) in
its own process (``--isolate``) and one of ``tests/distributed_workloads.py:ddp`` on 2 ranks
(``--nproc-per-node 2``), once with each start method, the order alternating round by round
so that both see the same machine load. The server starts before the first round (a search
pays that once, as a spawned run pays it every time). Printed: each side's median wall time
per run, and the median of the per-round ratios (spawned / forked) with their range.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def _run(method, spec, ranks, steps):
    import torch

    from scalertune._amp._config import AmpConfig
    from scalertune._processes import _start
    from scalertune._search._launch import run_isolated

    _start.START_METHOD = method
    started = time.perf_counter()
    run_isolated(
        spec,
        AmpConfig(dtype="float32"),
        steps=steps,
        seed=0,
        device=torch.device("cpu"),
        timeout_s=600,
        memory_gb=None,
        ranks=ranks,
    )
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    if "forkserver" not in __import__("multiprocessing").get_all_start_methods():
        sys.exit("this platform has no forkserver: every run is spawned")
    cases = {
        "1 process": (os.path.join(ROOT, "tests", "workloads.py") + ":healthy", 1),
        "2 ranks": (os.path.join(ROOT, "tests", "distributed_workloads.py") + ":ddp", 2),
    }
    for spec, ranks in cases.values():  # the server starts, once, as in a search
        _run("forkserver", spec, ranks, args.steps)
    print(f"{args.rounds} rounds, {args.steps} steps a run, float32, on {os.cpu_count()} cores")
    for name, (spec, ranks) in cases.items():
        times = {"spawn": [], "forkserver": []}
        for r in range(args.rounds):
            order = ("spawn", "forkserver") if r % 2 == 0 else ("forkserver", "spawn")
            for method in order:
                times[method].append(_run(method, spec, ranks, args.steps))
        ratios = [s / f for s, f in zip(times["spawn"], times["forkserver"])]
        print(
            f"{name}: spawned {statistics.median(times['spawn']):.2f} s a run, forked "
            f"{statistics.median(times['forkserver']):.2f} s a run: "
            f"{statistics.median(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f}x)"
        )


if __name__ == "__main__":
    main()
