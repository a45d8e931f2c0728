"""Tiny workloads that train as ranks of a ``torch.distributed`` group (gloo on a CPU), as a
user's script does under ``torchrun``: the factory finds the group up, wraps its model (DDP,
FSDP2's ``fully_shard``, FSDP1) and takes its rank's shard of the data through a
``DistributedSampler``. ``plain_loop`` is the yardstick: the same factory trained by a plain
GradScaler loop under ``torchrun``, as the user's script would train it.

Fault workloads read ``SCALERTUNE_TEST_FAULT`` (a file path): the first run whose rank 1
reaches step ``FAULT_STEP`` creates the file and dies (or hangs) there; later runs train.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

HERE = __file__
FAULT_STEP = 15


def _data(n=256, scale_targets=10.0, ranks=None):
    """The same samples on every rank (the factory runs under the same seed), sharded by
    the sampler: the global batch is 2 x 16 (``ranks=1``: the same global batch of 32 in
    one process)."""
    x = torch.randn(n, 8)
    y = x @ torch.randn(8, 1) * scale_targets
    dataset = TensorDataset(x, y)
    if ranks == 1:
        sampler = DistributedSampler(dataset, num_replicas=1, rank=0, seed=1)
        return DataLoader(dataset, batch_size=32, sampler=sampler)
    return DataLoader(dataset, batch_size=16, sampler=DistributedSampler(dataset, seed=1))


def _model():
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def _workload(model, horizon=None):
    out = {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.05),
        "loss_fn": nn.MSELoss(reduction="sum"),
        "batches": _data(),
    }
    if horizon:
        out["horizon"] = horizon
    return out


def ddp():
    """An MLP under DistributedDataParallel; float16 overflows its summed loss's gradients
    at a high loss scale, so a GradScaler backs off."""
    if dist.get_world_size() != 2 or dist.get_rank() not in (0, 1):
        raise RuntimeError("this workload trains as one rank of 2")
    return _workload(nn.parallel.DistributedDataParallel(_model()))


def single():
    """``ddp``'s training in one process: the same global batch (its 32 samples are the two
    ranks' 16), the loss halved as DDP averages the two ranks' summed losses' gradients."""
    mse = nn.MSELoss(reduction="sum")
    model = _model()
    return {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.05),
        "loss_fn": lambda out, y: mse(out, y) / 2,
        "batches": _data(ranks=1),
    }


def fsdp2():
    """The same MLP sharded with FSDP2's ``fully_shard`` (each Linear, then the root)."""
    from torch.distributed.fsdp import fully_shard

    model = _model()
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    return _workload(model)


def fsdp1():
    """The same MLP under FSDP1 (``FullyShardedDataParallel``), which needs
    ``ShardedGradScaler``."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return _workload(FullyShardedDataParallel(_model(), device_id=torch.device("cpu")))


def fsdp1_own_scaler():
    """``fsdp1`` trained by a step of its own with a plain ``torch.amp.GradScaler``: each
    rank unscales its own shard and skips on its own (the failure ShardedGradScaler fixes);
    the step still calls ``amp.step`` so that the runtime sees the step."""
    workload = fsdp1()
    model, optimizer, loss_fn = (
        workload.pop("model"),
        workload["optimizer"],
        workload.pop("loss_fn"),
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=5)

    def step(_model, batch, amp):
        x, y = batch
        with amp.autocast():
            loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        amp.scaler._scale = scaler._scale  # the runtime reads the scale the step uses
        return loss

    return {**workload, "model": model, "step": step}


def _fault(model, kind):
    """Rank 1 dies (``os._exit``) or hangs at ``FAULT_STEP``, once across runs."""
    marker = os.environ.get("SCALERTUNE_TEST_FAULT")
    if dist.get_rank() != 1 or not marker:
        return
    steps = [0]

    def hook(_module, _inputs):
        steps[0] += 1
        if steps[0] == FAULT_STEP:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.close(fd)
            if kind == "dies":
                os._exit(13)
            time.sleep(3600)

    model.register_forward_pre_hook(hook)


def ddp_rank_dies():
    """``ddp`` whose rank 1 exits hard at ``FAULT_STEP`` once."""
    workload = ddp()
    _fault(workload["model"], "dies")
    return workload


def ddp_rank_hangs():
    """``ddp`` whose rank 1 hangs at ``FAULT_STEP`` once."""
    workload = ddp()
    _fault(workload["model"], "hangs")
    return workload


def hf_trainer():
    """``tests/trainers.py``'s GPT-2 ``Trainer`` subclass whose loss overflows float16 at a
    high scale, accumulating 2 micro-batches, on the ranks: its Accelerator wraps the model
    (DDP) and shards the data."""
    import trainers

    return trainers.scaled_loss_trainer()


def hf_own_training(out, knobs_json=None):
    """The same Trainer's own ``train()`` under torchrun, made with ``fp16=True`` and run
    through Accelerate's float16 path with a plain GradScaler of ``knobs_json``'s knobs
    (float32 without them): each optimizer step's loss averaged over the ranks, and the
    steps its optimizer skipped (rank 0 writes them to ``out``)."""
    import json

    import trainers

    from scalertune._workload._rng import seed_everything

    seed_everything(0)  # as the search seeds a run before it calls the factory
    if knobs_json:
        trainer = trainers.scaled_loss_trainer_float16()
        scaler = torch.amp.GradScaler("cpu", **json.loads(knobs_json))
    else:
        trainer, scaler = trainers.scaled_loss_trainer(), None
    losses, skipped = trainers.hf_losses_and_skips(trainer, scaler)
    mean = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(mean)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"losses": (mean / dist.get_world_size()).tolist(), "skipped": skipped}, f)


def plain_loop(factory, config, steps, seed=0):
    """What the user's own script does under torchrun: the workload trained ``steps`` steps
    with a plain ``torch.amp.GradScaler`` (``ShardedGradScaler`` for FSDP1), its losses
    all-reduced to the global batch's. Returns (losses, scales) on every rank."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    torch.manual_seed(seed)
    workload = factory()
    model, optimizer, loss_fn = workload["model"], workload["optimizer"], workload["loss_fn"]
    fp16 = config["dtype"] == "float16"
    knobs = {
        k: config[k]
        for k in ("init_scale", "growth_factor", "backoff_factor", "growth_interval")
        if k in config
    }
    scaler_class = (
        ShardedGradScaler if isinstance(model, FullyShardedDataParallel) else torch.amp.GradScaler
    )
    scaler = scaler_class("cpu", enabled=fp16, **knobs)
    dtype = getattr(torch, config["dtype"])
    losses, scales, epoch = [], [], 0
    loader = workload["batches"]
    while len(losses) < steps:
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
                loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            mean = loss.detach().float().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / dist.get_world_size())
            scales.append(scaler.get_scale() if fp16 else 1.0)
            if len(losses) == steps:
                break
        epoch += 1
    return losses, scales


def end_rank():
    """The group ended by both ranks together; then out without the C++ destructors at exit,
    where a gloo thread left behind aborts a rank now and then ("terminate called without an
    active exception": torch alone, with no scalertune in this process; seen once in CI in
    the plain loop, more often under the Trainer's stack) and torchrun fails the run. How
    every script of these tests that torchrun launches ends."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":  # torchrun --nproc-per-node 2 THIS CONFIG_JSON STEPS OUT FACTORY...
    import json
    import sys

    if sys.argv[1] == "hf":  # THIS hf OUT [SCALER_JSON]: the Trainer's own train()
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        hf_own_training(*sys.argv[2:])
        end_rank()  # the group Accelerate made
    dist.init_process_group("gloo")
    config_json, steps, out, *names = sys.argv[1:]
    runs = {
        name: plain_loop(globals()[name], json.loads(config_json), int(steps)) for name in names
    }
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(
                {
                    name: {"losses": losses, "scales": scales}
                    for name, (losses, scales) in runs.items()
                },
                f,
            )
    end_rank()


def ddp_rank_killed():
    """``ddp`` on the ranks it declares, one of whose ranks SIGKILLs itself once, at a point
    ``SCALERTUNE_TEST_RANK_KILL`` names (``MARKER:RANK:RUN:STEP``): in the RUN-th run that
    trains on rank RANK (counted across the processes of a search, one byte a run in
    ``MARKER.runs``), as it starts step STEP; ``MARKER`` is created then, and no later run
    is killed."""
    workload = ddp()
    planned = os.environ.get("SCALERTUNE_TEST_RANK_KILL")
    if not planned:
        return workload
    marker, rank, run, step = planned.rsplit(":", 3)
    if dist.get_rank() != int(rank) or os.path.exists(marker) or not _trains():
        return workload
    with open(f"{marker}.runs", "ab") as f:  # one byte per run of this rank
        f.write(b".")
        this_run = f.tell()
    if this_run != int(run):
        return workload
    steps = [0]

    def hook(_module, _inputs):
        steps[0] += 1
        if steps[0] == int(step):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    workload["model"].register_forward_pre_hook(hook)
    return workload


ddp_rank_killed.nproc_per_node = 2


def _trains():
    """Whether this factory call is for a run that trains: not the one-step check of the
    factory (``preflight``), the step timing (``time_dtypes``) or the locating of a failure,
    which are no trials, nor the reference's start-up probe (``_probe``: a few batches at
    the initial weights, on an instance of its own, fewer steps than a kill may be drawn
    at). Where the search runs its jobs in processes of their own, a job that is no run is
    anything but a ``RunJob``."""
    frame = sys._getframe(1)
    while frame is not None:
        code, local = frame.f_code.co_name, frame.f_locals
        if code in ("preflight", "_probe") or (
            code == "perform" and type(local.get("self")).__name__ != "RunJob"
        ):
            return False
        frame = frame.f_back
    return True
