"""Workers: sampled trials per minute with 1 and 2 worker processes on one journal file.

Each worker gets one torch thread (OMP_NUM_THREADS=1), so that two workers on two cores do
not oversubscribe them; the 1-worker row uses one thread too, for a like-for-like ratio.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_TRIALS = 12
EXAMPLE = "examples/classifier.py:make_model"


def _search(n_workers: int, folder: str) -> float:
    journal = os.path.join(folder, f"w{n_workers}.log")
    cmd = [sys.executable, "-m", "scalertune", "search", EXAMPLE,
           "--storage", journal, "--study-name", "bench", "--n-trials", str(N_TRIALS),
           "--device", "cpu", "-q", "-o", os.path.join(folder, f"w{n_workers}.yaml")]
    started = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    workers = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=env) for _ in range(n_workers)]
    for w in workers:
        _, err = w.communicate()
        if w.returncode != 0:
            raise RuntimeError(err.decode())
    return time.perf_counter() - started


def measure() -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for n in (1, 2):
            seconds = _search(n, folder)
            rows.append({"workers": n, "seconds": seconds,
                         "trials_per_minute": N_TRIALS / seconds * 60})
    return rows
