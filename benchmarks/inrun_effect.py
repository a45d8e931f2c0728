"""What the in-run check does for a run that fails late: each of the three late failures
(a precision floor, an activation that grows past float16's range, a burst of large gradients
that collapses the loss scale) trained to step 3000 three ways, side by side from the same
seed and batches: plain float32, the config a short search hands out trained as it is, and
the same config through the runtime ``scalertune.load`` builds (its in-run check at the
default policy: a float32 forward every 100 steps, act).

    python benchmarks/inrun_effect.py [--seeds 0 1 2] [--steps 3000]

Each figure is the run's loss over float32's at the end (the mean of the last 100 steps that
are not the burst's), median and range over the seeds, with what the check did. The scaler
case's watch holds the replay's prediction of its 200-step trial, as a search writes it.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import warnings
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import late_workloads  # noqa: E402
from plain_loop import predicted, tail_loss  # noqa: E402

import scalertune  # noqa: E402
from scalertune import AmpCheckWarning, AmpConfig, AmpRuntime, CheckPolicy  # noqa: E402
from scalertune._amp._watch import Watch  # noqa: E402
from scalertune._inrun import InRunCheck  # noqa: E402

CPU = torch.device("cpu")


CASES = {
    "precision floor (readings_near_1000, bfloat16)": (
        late_workloads.readings_near_1000,
        AmpConfig(dtype="bfloat16"),
        None,
    ),
    "late overflow (growing_activations, float16 defaults)": (
        late_workloads.growing_activations,
        AmpConfig(),
        None,
    ),
    "scale collapsed by a burst (tanh_regression, float16, clip 1)": (
        late_workloads.tanh_regression,
        AmpConfig(clip_norm=1.0),
        late_workloads.with_burst,
    ),
}


def _one(case: tuple[Any, AmpConfig, Any], seed: int, steps: int) -> tuple[float, float, str]:
    factory, config, batch = case
    float32 = tail_loss(factory, None, steps, batch, seed)
    # the watch a loaded answer carries (the scaler case): the replay's prediction over
    # float32's 200 steps, made once for both runs
    prediction = predicted(factory, config) if batch else None

    def watch() -> Watch | None:
        return Watch(prediction) if prediction is not None else None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", scalertune.AmpDriftWarning)
        fixed = tail_loss(
            factory, AmpRuntime(config, device=CPU, watch=watch()), steps, batch, seed
        )
    amp = AmpRuntime(config, device=CPU, watch=watch(), check=InRunCheck(CheckPolicy()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checked = tail_loss(factory, amp, steps, batch, seed)
    said = [str(w.message) for w in caught if issubclass(w.category, AmpCheckWarning)]
    return fixed / float32, checked / float32, said[0] if said else "(nothing said)"


def _spread(values: list[float]) -> str:
    if not all(map(math.isfinite, values)):
        finite = sum(map(math.isfinite, values))
        return f"not finite at the end in {len(values) - finite} of {len(values)} seeds"
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name, case in CASES.items():
        runs = [_one(case, seed, args.steps) for seed in args.seeds]
        print(f"{name}:")
        print(f"  as searched: {_spread([r[0] for r in runs])} float32's loss at step {args.steps}")
        print(f"  checked:     {_spread([r[1] for r in runs])}")
        for seed, run in zip(args.seeds, runs, strict=True):
            print(f"  seed {seed}: {run[2] if seed == args.seeds[0] else run[2][:40]}")


if __name__ == "__main__":
    main()
