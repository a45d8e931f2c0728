"""A private workload for searches whose ranks span hosts, with the user's own launcher: two
torchrun "nodes" on loopback, one process each (gloo). ``make_model`` wraps its model in
DistributedDataParallel and shards its data, as a two-node training script does; float16
overflows its summed loss's gradients at a high loss scale, so GradScaler backs off.

``python -m torch.distributed.run --nnodes 2 ... THIS CONFIGS_JSON STEPS OUT`` is the
yardstick: the same factory trained by a plain GradScaler loop under the same two-node
torchrun, config after config, each step's scale written to ``OUT`` by rank 0.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

HERE = __file__


def make_model():
    """A GELU MLP under DDP, one rank of 2 (one per host)."""
    return _workload(lambda model: nn.parallel.DistributedDataParallel(model))


def make_model_fsdp2():
    """The same MLP sharded over the two hosts with FSDP2's ``fully_shard``."""
    from torch.distributed.fsdp import fully_shard

    def shard(model):
        for layer in (model[0], model[2]):
            fully_shard(layer)
        return fully_shard(model)

    return _workload(shard)


def _workload(wrap):
    if not dist.is_initialized() or dist.get_world_size() != 2:
        raise RuntimeError("this workload trains as one rank of 2, one per host")
    x = torch.randn(384, 12)
    y = (x[:, :4] ** 2).sum(dim=1, keepdim=True) * 8.0 + x @ torch.randn(12, 1) * 6.0
    dataset = TensorDataset(x, y)
    model = wrap(nn.Sequential(nn.Linear(12, 40), nn.GELU(), nn.Linear(40, 1)))
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.03),
        "loss_fn": nn.MSELoss(reduction="sum"),
        "batches": DataLoader(dataset, batch_size=24, sampler=DistributedSampler(dataset, seed=3)),
    }


if __name__ == "__main__":  # torchrun --nnodes 2 ... THIS CONFIGS_JSON STEPS OUT
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from distributed_workloads import end_rank, plain_loop

    dist.init_process_group("gloo")
    configs, steps, out = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    scales = [plain_loop(make_model, config, steps)[1] for config in configs]
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(scales, f)
    end_rank()
