"""Step time of float16 and bfloat16 against float32 on the mid-size transformer.

The same interleaved timing a search runs once per study (``scalertune._run._timing``): one
10-step window per dtype in turn, six rounds after 3 warm-up steps of each, on one workload. The
per-round ratios and their spread are what a verdict on this device would carry.
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import models  # noqa: E402

from scalertune._run._step_times import spread  # noqa: E402
from scalertune._run._timing import time_dtypes  # noqa: E402
from scalertune._workload._factory import build_workload  # noqa: E402


def measure(device: torch.device) -> list[dict[str, Any]]:
    workload = build_workload(models.midsize, seed=0, device=device)
    times = time_dtypes(workload, ["bfloat16", "float16"], device=device, clip_norm=None)
    rows = [
        {
            "dtype": "float32",
            "ms": statistics.median(times.rounds["float32"]) * 1e3,
            "ratio": 1.0,
            "low": 1.0,
            "high": 1.0,
        }
    ]
    for dtype in ("bfloat16", "float16"):
        if dtype in times:
            low, high = spread(times.ratios(dtype))
            rows.append(
                {
                    "dtype": dtype,
                    "ms": times.median(dtype) * 1e3,
                    "ratio": times.ratio(dtype),
                    "low": low,
                    "high": high,
                }
            )
    return rows


if __name__ == "__main__":
    for row in measure(torch.device("cuda" if torch.cuda.is_available() else "cpu")):
        print(row)
