"""A DeepSpeed factory searched in DeepSpeed's engine, and ``SearchResult.predict`` of fp16
blocks against a plain DeepSpeed engine's own count of skipped steps.

    python benchmarks/deepspeed_predict.py
    python benchmarks/deepspeed_predict.py --stage 1 --horizon 300

A small regression (its own factory, here: not one the tests or examples use) with its
ZeRO config, readings in the tens so that float16 gradients overflow at DeepSpeed's default
scale. It is searched with ``scalertune search FACTORY --space float16 --horizon H`` from
the command line (exit status 0 expected); then, for four fixed fp16 blocks and the one
``scalertune export --to deepspeed --best-amp`` writes, a plain DeepSpeed engine trains H
steps as DeepSpeed's tutorials write the loop (``deepspeed.initialize`` with the block, the
inputs cast to float16, ``engine.backward``, ``engine.step``), seeded as the search seeds
its runs, and its ``engine.skipped_steps`` is compared with what the study predicts for the
block. Agreement is within max(2, 20%) of the real count, the replay's calibrated tolerance.
DeepSpeed's CPU accelerator refuses fp16 where oneDNN has no float16 matmul; the plain loop
allows it as scalertune does, or it could not train fp16 on such a CPU at all.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from torch import nn

HERE = os.path.abspath(__file__)

#: Four blocks a DeepSpeed user might write: DeepSpeed's defaults, a high start that backs
#: off on every overflow, a low start that grows fast, a floor of 64 with hysteresis 3.
FIXED = [
    {"enabled": True},
    {"enabled": True, "initial_scale_power": 22, "loss_scale_window": 50, "hysteresis": 1},
    {"enabled": True, "initial_scale_power": 4, "loss_scale_window": 20, "hysteresis": 2},
    {
        "enabled": True,
        "initial_scale_power": 14,
        "loss_scale_window": 100,
        "hysteresis": 3,
        "min_loss_scale": 64,
    },
]


def make_model(stage: int = 2) -> dict:
    generator = torch.Generator().manual_seed(1)
    model = nn.Sequential(
        nn.Linear(24, 96), nn.GELU(), nn.Linear(96, 96), nn.GELU(), nn.Linear(96, 1)
    )
    weights = torch.randn(24, 1, generator=generator)
    batches = []
    for _ in range(12):
        x = torch.randn(48, 24, generator=generator)
        y = x @ weights * 8.0 + (x[:, 1:2] * x[:, 2:3]) * 15.0
        batches.append((x, y + 3.0 * torch.randn(48, 1, generator=generator)))  # a floor
    return {
        "model": model,
        "optimizer": torch.optim.AdamW(model.parameters(), lr=3e-3),
        "loss_fn": nn.functional.mse_loss,
        "batches": batches,
        "deepspeed": {
            "train_micro_batch_size_per_gpu": 48,
            "zero_optimization": {"stage": stage},
            "fp16": {"enabled": True},
            "gradient_clipping": 1.0,
        },
    }


def make_stage1() -> dict:
    return make_model(stage=1)


def plain_deepspeed(factory, block: dict, steps: int) -> int:
    """DeepSpeed's own training of the workload with ``block``: its skipped steps."""
    import deepspeed

    from scalertune._frameworks._deepspeed import process_group, quiet
    from scalertune._frameworks._deepspeed_private import allow_float16
    from scalertune._workload._rng import seed_everything

    seed_everything(0)
    parts = factory()
    allow_float16()
    process_group()
    with quiet():
        engine, *_ = deepspeed.initialize(
            model=parts["model"],
            optimizer=parts["optimizer"],
            config={**parts["deepspeed"], "fp16": block},
        )
    for i in range(steps):
        x, y = parts["batches"][i % len(parts["batches"])]
        engine.backward(parts["loss_fn"](engine(x.half()), y))
        engine.step()
    skipped = int(engine.skipped_steps)
    engine.destroy()
    return skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", type=int, default=2, choices=(1, 2))
    parser.add_argument("--horizon", type=int, default=300)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(HERE))
    import scalertune
    from scalertune._judge._rank import skip_tolerance

    name = "make_model" if args.stage == 2 else "make_stage1"
    folder = tempfile.mkdtemp(prefix="scalertune-ds-predict-")
    storage = os.path.join(folder, "study.db")
    search = subprocess.run(
        [
            sys.executable, "-m", "scalertune", "search", f"{HERE}:{name}",
            "--space", "float16", "--horizon", str(args.horizon),
            "--storage", storage, "-o", os.path.join(folder, "ds.yaml"), "--quiet",
        ],
        capture_output=True, text=True, cwd=folder,
    )  # fmt: skip
    print(f"search --space float16 --horizon {args.horizon}: exit {search.returncode}")
    if search.returncode != 0:
        sys.exit(search.stderr)
    exported = subprocess.run(
        [sys.executable, "-m", "scalertune", "export", "ds.yaml", "--to", "deepspeed",
         "--best-amp"],
        capture_output=True, text=True, cwd=folder,
    )  # fmt: skip
    if exported.returncode != 0:
        sys.exit(exported.stderr)
    blocks = [*FIXED, json.loads(exported.stdout)["fp16"]]
    import optuna

    result = scalertune.analyze(optuna.load_study(study_name=None, storage=f"sqlite:///{storage}"))
    factory = make_model if args.stage == 2 else make_stage1
    agree = 0
    print(f"{'fp16 block':<100} predicted  DeepSpeed  within")
    for block in blocks:
        predicted = result.predict(block).skipped_steps
        real = plain_deepspeed(factory, block, args.horizon)
        ok = abs(predicted - real) <= skip_tolerance(real)
        agree += ok
        shown = json.dumps({k: v for k, v in block.items() if k != "enabled"})
        print(f"{shown:<100} {predicted:>9}  {real:>9}  {'yes' if ok else 'NO'}")
    print(f"{agree} of {len(blocks)} within max(2, 20%) over {args.horizon} steps")


if __name__ == "__main__":
    main()
