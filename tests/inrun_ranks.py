"""A late precision floor trained on 2 DDP ranks under torchrun, as the user's script would:
float32, then bfloat16 through a runtime that checks itself; and an FSDP2 model whose
bfloat16 output rounds by 4, checked at every step. Each rank writes what it saw.

    torchrun --nproc-per-node 2 tests/inrun_ranks.py OUT_FOLDER STEPS
"""

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import distributed_workloads  # noqa: E402
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


def fsdp2():
    """A model fully sharded (FSDP2) whose bfloat16 output near 1000 rounds by 4, learning
    nothing: the check finds the gap at once and keeps the output layer in float32."""
    from torch.distributed.fsdp import fully_shard

    from scalertune import CheckPolicy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    with torch.no_grad():
        model[2].bias.fill_(1000.0)
    x = torch.randn(64, 6)
    with torch.no_grad():
        y = model(x) + 0.01 * torch.randn(64, 1)
    for layer in (model[0], model[2], model):
        fully_shard(layer)
    check = InRunCheck(CheckPolicy(every=1, window=3))
    amp = AmpRuntime(AmpConfig(dtype="bfloat16"), device="cpu", check=check)
    model = amp.prepare(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmpCheckWarning)
        for _ in range(5):
            amp.train_step(model, optimizer, torch.nn.functional.mse_loss, (x, y))
    return {
        "actions": [a.to_dict() for a in check.actions.done],
        "islands": amp.config.fp32_modules,
    }


def copies(all_reduce):
    """A model no rank wraps in DDP, each rank training on its own batches: its copies drift
    apart and the check says so, once; with the gradients all-reduced in the step by hand,
    they are one model and it says nothing."""
    from scalertune import CheckPolicy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    amp = AmpRuntime(
        AmpConfig(dtype="bfloat16"), device="cpu", check=InRunCheck(CheckPolicy(every=5))
    )
    model = amp.prepare(model)
    generator = torch.Generator().manual_seed(dist.get_rank())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(16):
            x = torch.randn(8, 6, generator=generator)
            optimizer.zero_grad()
            amp.backward(amp.loss(lambda x=x: torch.nn.functional.mse_loss(model(x), x[:, :1])))
            if all_reduce:
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                    p.grad /= dist.get_world_size()
            amp.step(optimizer)
    return [str(w.message) for w in caught if issubclass(w.category, AmpCheckWarning)]


if __name__ == "__main__":
    dist.init_process_group("gloo")
    out, steps = sys.argv[1], int(sys.argv[2])
    found = {dtype: train(dtype, steps) for dtype in ("float32", "bfloat16")}
    found["fsdp2"] = fsdp2()
    found["copies"] = copies(all_reduce=False)
    found["all_reduced"] = copies(all_reduce=True)
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(found, f)
    distributed_workloads.end_rank()
