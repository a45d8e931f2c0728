"""A late precision floor trained on 2 DDP ranks under torchrun, as the user's script would:
float32, then bfloat16 through a runtime that checks itself. Each rank writes what it saw.

    torchrun --nproc-per-node 2 tests/inrun_ranks.py OUT_FOLDER STEPS
"""

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import late_workloads  # noqa: E402

from scalertune import AmpCheckWarning, AmpConfig, AmpRuntime  # noqa: E402
from scalertune._inrun import InRunCheck  # noqa: E402


def train(dtype, steps):
    """readings_near_1000 on this rank's half of the batches, its model in DDP; the mean loss
    of the global batch over the last 100 steps, and the check's actions."""
    torch.manual_seed(0)
    workload = late_workloads.readings_near_1000()
    model = torch.nn.parallel.DistributedDataParallel(workload["model"])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    mine = workload["batches"][dist.get_rank() :: dist.get_world_size()]
    check = InRunCheck() if dtype != "float32" else None
    amp = AmpRuntime(AmpConfig(dtype=dtype), device="cpu", check=check)
    model = amp.prepare(model)
    tail = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(steps):
            loss = amp.train_step(model, optimizer, workload["loss_fn"], mine[step % len(mine)])
            if step >= steps - 100:
                mean = loss.detach().clone()
                dist.all_reduce(mean)
                tail.append(float(mean) / dist.get_world_size())
    lines = [str(w.message) for w in caught if issubclass(w.category, AmpCheckWarning)]
    actions = [a.to_dict() for a in check.actions.done] if check else []
    return {"loss": sum(tail) / len(tail), "lines": lines, "actions": actions}


if __name__ == "__main__":
    dist.init_process_group("gloo")
    out, steps = sys.argv[1], int(sys.argv[2])
    found = {dtype: train(dtype, steps) for dtype in ("float32", "bfloat16")}
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(found, f)
    dist.destroy_process_group()
