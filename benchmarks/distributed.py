"""Runs on 2 ranks against the user's own loop under torchrun, and the search at 1 and 2
processes: python benchmarks/distributed.py [--rounds 5] [--steps 200] [--search]

Per-step time: a 2-rank run of ``tests/distributed_workloads.py:ddp`` (DDP, gloo on a CPU,
float16 with a GradScaler) through scalertune's launcher, and the same factory trained by a
plain GradScaler loop under ``torchrun --nproc-per-node 2`` (a loss read per step, as the
run reads it on a CPU), interleaved round by round so that both see the same machine load.
Each side's per-step time is the median of its 10-step windows after the first; the figure
is the median of the per-round ratios, with their range.

``--search``: the default float16 search of ``single`` (one process, global batch 32) and of
``ddp`` with ``--nproc-per-node 2`` (the same global batch as 2 x 16): its wall time, its
cost in run-equivalents and its answer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKLOADS = os.path.join(ROOT, "tests", "distributed_workloads.py")
CONFIG = {
    "dtype": "float16",
    "init_scale": 1024.0,
    "growth_factor": 2.0,
    "backoff_factor": 0.5,
    "growth_interval": 2000,
}

_PLAIN = r"""
import json, statistics, sys, time
import torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import distributed_workloads as w
dist.init_process_group("gloo")
config, steps, out = json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
work = w.ddp()
model, opt, loss_fn, loader = work["model"], work["optimizer"], work["loss_fn"], work["batches"]
scaler = torch.amp.GradScaler("cpu", **{k: v for k, v in config.items() if k != "dtype"})
windows, losses, epoch, done = [], [], 0, 0
start = time.perf_counter()
while done < steps:
    loader.sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
        done += 1
        if done % 10 == 0:
            windows.append((time.perf_counter() - start) / 10)
            start = time.perf_counter()
        if done == steps:
            break
    epoch += 1
if dist.get_rank() == 0:
    json.dump(statistics.median(windows[1:]), open(out, "w"))
dist.destroy_process_group()
"""


def plain_step_time(steps: int, folder: str) -> float:
    script, out = os.path.join(folder, "plain.py"), os.path.join(folder, "plain.json")
    with open(script, "w") as f:
        f.write(_PLAIN)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            script,
            os.path.dirname(WORKLOADS),
            json.dumps(CONFIG),
            str(steps),
            out,
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    with open(out) as f:
        return float(json.load(f))


def scalertune_step_time(steps: int) -> float:
    import torch

    from scalertune._amp._config import AmpConfig
    from scalertune._search._launch import run_isolated

    record = run_isolated(
        f"{WORKLOADS}:ddp",
        AmpConfig(**CONFIG),
        steps=steps,
        seed=0,
        device=torch.device("cpu"),
        timeout_s=600,
        memory_gb=None,
        ranks=2,
    )
    return statistics.median(record.window_step_times[1:])


def step_times(rounds: int, steps: int) -> None:
    ratios, ours, theirs = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(rounds):
            theirs.append(plain_step_time(steps, folder))
            ours.append(scalertune_step_time(steps))
            ratios.append(ours[-1] / theirs[-1])
    print(
        f"per-step time, 2 ranks (DDP, gloo), {rounds} rounds of {steps} steps: "
        f"scalertune {statistics.median(ours) * 1e3:.3g} ms, torchrun loop "
        f"{statistics.median(theirs) * 1e3:.3g} ms; ratio {statistics.median(ratios):.3f} "
        f"(range {min(ratios):.3f}-{max(ratios):.3f})"
    )


def searches() -> None:
    import scalertune

    for name, nproc in (("single", 1), ("ddp", 2)):
        with tempfile.TemporaryDirectory() as folder:
            started = time.perf_counter()
            result = scalertune.search(
                f"{WORKLOADS}:{name}",
                space="float16",
                n_trials=6,
                steps=40,
                device="cpu",
                nproc_per_node=nproc,
                storage=os.path.join(folder, "s.db"),
                artifact_dir=os.path.join(folder, "art"),
            )
            wall = time.perf_counter() - started
            summary = result.summary().splitlines()
            cost = next((line for line in summary if line.startswith("Cost:")), "")
            best = result.best_amp.config if result.best_amp is not None else None
            print(
                f"search of {name} on {nproc} process(es): {wall:.0f} s; {cost}; "
                f"answer {result.config}; best AMP {best}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--search", action="store_true")
    args = parser.parse_args()
    step_times(args.rounds, args.steps)
    if args.search:
        searches()


if __name__ == "__main__":
    main()
