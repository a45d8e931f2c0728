"""A search with ``--horizon`` against one whose trials are as long as the horizon, side by
side, on a workload whose failure crosses late: python benchmarks/horizon.py [WORKLOAD]

WORKLOAD is a factory of tests/late_workloads.py. readings_near_1000 (the default): bfloat16
ties float32 for 1000 steps, then falls 2.5x behind by step 2000; PyTorch's float16 defaults,
and bfloat16 with its last layer in float32, hold. plateau_mlp (trials of 100 steps, as its
author ran it): bfloat16 follows float32 in every branch from float32's weights, and trained
from step 0 stalls on a plateau (1.84x float32's loss at step 2000). Each search's cost is in
run-equivalents of the horizon (training steps over 2000), and each answer (the config to
train with, and the best AMP config that held) is checked by training it the whole horizon
in a plain GradScaler loop: its loss over float32's at the end.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(ROOT, "tests")]

import late_workloads  # noqa: E402
import optuna  # noqa: E402
import torch  # noqa: E402
from plain_loop import ratio_at_the_end  # noqa: E402

import scalertune  # noqa: E402

HORIZON = 2000
#: Trials' length per workload (the default 200 where not named).
STEPS = {"plateau_mlp": 100}


def one(name: str, label: str, **kwargs: Any) -> dict[str, Any]:
    factory = getattr(late_workloads, name)
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        result = scalertune.search(
            os.path.join(ROOT, "tests", f"late_workloads.py:{name}"),
            storage=f"sqlite:///{folder}/h.db",
            device="cpu",
            artifact_dir=folder,
            **kwargs,
        )
        wall = time.perf_counter() - started
    best = result.best_amp
    return {
        "label": label,
        "run_equivalents": result.steps_trained / HORIZON,
        "wall_s": wall,
        "answer": result.config.describe(),
        "answer_ratio": ratio_at_the_end(factory, result.config, HORIZON),
        "best_amp": None if best is None else best.config.describe(),
        "best_amp_ratio": None if best is None else ratio_at_the_end(factory, best.config, HORIZON),
    }


def measure(name: str) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    steps = STEPS.get(name, 200)
    return [
        one(name, f"--horizon {HORIZON} (trials of {steps})", horizon=HORIZON, steps=steps),
        one(name, f"--steps {HORIZON} (trials of {HORIZON})", steps=HORIZON),
    ]


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "readings_near_1000"
    print(f"Horizon against long trials on {name}, horizon {HORIZON} steps")
    print(
        f"   {'search':<30} {'run-equiv':>9} {'wall s':>7}  answer (its loss / float32's "
        f"at {HORIZON}); best AMP config (same)"
    )
    for r in measure(name):
        best = (
            "none held"
            if r["best_amp"] is None
            else f"{r['best_amp']} ({r['best_amp_ratio']:.2f}x)"
        )
        print(
            f"   {r['label']:<30} {r['run_equivalents']:>9.2f} {r['wall_s']:>7.0f}  "
            f"{r['answer']} ({r['answer_ratio']:.2f}x); {best}"
        )


if __name__ == "__main__":
    main()
