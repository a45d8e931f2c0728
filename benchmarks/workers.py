"""Workers: does a second worker process on one journal file finish a search sooner?

A search's work is not fixed (runs stop at the target, sampling stops when it stops finding
faster configs), so throughput is measured as training steps per second of wall time, and cost
as CPU seconds per training step (all processes). 1-worker and 2-worker searches of the same
study settings run in interleaved pairs (the order alternating from pair to pair), each worker
with one torch thread so that two workers on two cores do not oversubscribe them; the ratio of
each pair and its spread over the pairs are reported, not a single run.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_TRIALS = 12
PAIRS = 3
EXAMPLE = "examples/classifier.py:make_model"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _search(n_workers: int, folder: str, tag: str) -> dict[str, float]:
    journal = os.path.join(folder, f"{tag}.log")
    cmd = [
        sys.executable,
        "-m",
        "scalertune",
        "search",
        EXAMPLE,
        "--storage",
        journal,
        "--study-name",
        "bench",
        "--n-trials",
        str(N_TRIALS),
        "--device",
        "cpu",
        "-q",
        "-o",
        os.path.join(folder, f"{tag}.yaml"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cpu, started = _children_cpu(), time.perf_counter()
    procs = [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        for _ in range(n_workers)
    ]
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(err.decode())
    wall, cpu = time.perf_counter() - started, _children_cpu() - cpu
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "scalertune",
            "report",
            "--storage",
            journal,
            "--study-name",
            "bench",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    steps = json.loads(report.stdout)["evidence"]["cost"]["training_steps"]
    return {"wall_s": wall, "cpu_s": cpu, "steps": steps}


def measure() -> dict[str, Any]:
    runs: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as folder:
        for pair in range(PAIRS):
            for n in (1, 2) if pair % 2 == 0 else (2, 1):
                runs[n].append(_search(n, folder, f"p{pair}w{n}"))
    ratios = [
        (b["steps"] / b["wall_s"]) / (a["steps"] / a["wall_s"]) for a, b in zip(runs[1], runs[2])
    ]
    return {
        "pairs": PAIRS,
        "steps_per_s": {n: [r["steps"] / r["wall_s"] for r in rs] for n, rs in runs.items()},
        "cpu_ms_per_step": {
            n: [r["cpu_s"] / r["steps"] * 1e3 for r in rs] for n, rs in runs.items()
        },
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


if __name__ == "__main__":
    print(measure())
