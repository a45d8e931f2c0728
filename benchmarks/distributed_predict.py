"""``SearchResult.predict`` on ranks against the user's own loop under torchrun.

    python benchmarks/distributed_predict.py --wrap fsdp2 --configs 6
    python benchmarks/distributed_predict.py --wrap ddp --configs 8

A small residual MLP with LayerNorm (its own factory, here: not one the tests use), wrapped
as a user's script wraps it (``fully_shard`` per block and at the root, or DDP), each rank
taking its shard of the data through a ``DistributedSampler``, regression targets in the
hundreds under a summed loss, so that float16 gradients overflow at high scales. It is
searched with ``--nproc-per-node 2 --space float16 --horizon 400``; then, for random float16
scaler settings, the skipped steps the study predicts over the 400 steps are compared with
those of a plain ``torch.amp.GradScaler`` loop of the same factory under ``torchrun
--nproc-per-node 2`` (a step is skipped where the scale backs off). Agreement is within
max(2, 20%) of the real count, the replay's calibrated tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

HERE = os.path.abspath(__file__)
HORIZON = 400
KNOBS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


def _workload(wrap: str) -> dict:
    torch.manual_seed(0)
    x = torch.randn(512, 16) * 3
    y = (x[:, :4] ** 2).sum(1, keepdim=True) * 50 + 200
    model: nn.Module = nn.Sequential(nn.Linear(16, 24), Block(24), Block(24), nn.Linear(24, 1))
    if wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for block in (model[1], model[2]):
            fully_shard(block)
        fully_shard(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
    data = TensorDataset(x, y)
    return {
        "model": model,
        "optimizer": torch.optim.AdamW(model.parameters(), lr=3e-3),
        "loss_fn": nn.MSELoss(reduction="sum"),
        "batches": DataLoader(data, batch_size=16, sampler=DistributedSampler(data, seed=3)),
    }


def fsdp2() -> dict:
    return _workload("fsdp2")


def ddp() -> dict:
    return _workload("ddp")


def plain_skips(wrap: str, config: dict, steps: int) -> int:
    """The user's loop: a plain GradScaler with ``config``'s knobs; its skipped steps."""
    torch.manual_seed(0)
    w = _workload(wrap)
    model, optimizer, loss_fn, loader = w["model"], w["optimizer"], w["loss_fn"], w["batches"]
    scaler = torch.amp.GradScaler("cpu", **{k: config[k] for k in KNOBS})
    skipped = epoch = n = 0
    while n < steps:
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.float16):
                loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            skipped += scaler.get_scale() < before
            n += 1
            if n == steps:
                break
        epoch += 1
    return skipped


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wrap", choices=("fsdp2", "ddp"), default="fsdp2")
    parser.add_argument("--configs", type=int, default=6)
    args = parser.parse_args()
    import scalertune
    from scalertune._judge._rank import skip_tolerance

    folder = tempfile.mkdtemp(prefix="scalertune-predict-")
    result = scalertune.search(
        f"{HERE}:{args.wrap}",
        storage=f"sqlite:///{folder}/s.db",
        space="float16",
        horizon=HORIZON,
        nproc_per_node=2,
        device="cpu",
        artifact_dir=f"{folder}/artifacts",
    )
    print(f"search: {result.run_equivalents:.1f} run-eq, answer {result.config.describe()}")
    rng, agree = random.Random(11), 0
    for i in range(args.configs):
        config = {
            "dtype": "float16",
            "init_scale": 2.0 ** rng.uniform(4, 24),
            "growth_factor": rng.uniform(1.5, 4.0),
            "backoff_factor": rng.uniform(0.25, 0.75),
            "growth_interval": rng.randint(10, 500),
        }
        predicted = result.predict(scalertune.AmpConfig(**config), horizon=HORIZON).skipped_steps
        out = os.path.join(folder, f"plain{i}.json")
        subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            + ["--nproc-per-node", "2", HERE, "loop", args.wrap, json.dumps(config), out],
            check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
        )
        with open(out) as f:
            real = json.load(f)["skipped"]
        ok = abs(predicted - real) <= skip_tolerance(real)
        agree += ok
        knobs = ", ".join(f"{k} {config[k]:.4g}" for k in KNOBS)
        print(f"{knobs}: predicted {predicted}, real {real} {'ok' if ok else 'MISS'}", flush=True)
    print(f"{args.wrap}: {agree} of {args.configs} within max(2, 20%)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["loop"]:  # under torchrun: loop WRAP CONFIG_JSON OUT
        dist.init_process_group("gloo")
        skipped = plain_skips(sys.argv[2], json.loads(sys.argv[3]), HORIZON)
        if dist.get_rank() == 0:
            with open(sys.argv[4], "w") as f:
                json.dump({"skipped": int(skipped)}, f)
        dist.destroy_process_group()
    else:
        main()
