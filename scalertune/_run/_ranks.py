"""One run as N ranks: joining the process group, and what the ranks share once per window.

With ``--nproc-per-node N`` every run of a search is N processes, each one rank of a
``torch.distributed`` process group, the way ``torchrun`` starts a training script: the
factory is called in every rank with the group already there, so it wraps its model (DDP,
FSDP2's ``fully_shard``, FSDP1) and takes its rank's shard of the data as the user's script
does. The ranks train in lockstep; rank 0 alone speaks to the search.

Nothing here adds a collective to a training step. Once per read-back window the ranks
exchange what they read back (:func:`agree`):

- each step's loss, averaged over the ranks: the loss of the global batch, what a plain
  loop that all-reduces its loss for logging reports;
- each step's loss scale and the count of skipped steps, which must be equal on every rank.
  DDP all-reduces the gradients and FSDP2 all-reduces GradScaler's ``found_inf`` over the
  mesh, so every rank skips the same steps; a scaler that decides on its own rank's
  gradients (a plain GradScaler under FSDP1, pytorch #90057's ``join()``) drifts, and such a
  run is stopped with :class:`RanksDisagree` instead of averaged into a curve no rank trained.

The gradient trace reduces its per-window rows the same way (:func:`reduce`).

Before any run, the search's one float32 step checks that the ranks train one model
(:class:`~scalertune._inrun._replicas.Replicas`): a factory that forgets
DistributedDataParallel trains a copy per rank, each on its own shard of the data, and no
collective of a step would say so.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence

import torch

from scalertune._run import _policy as _run_policy


class RanksDisagree(RuntimeError):
    """The ranks' GradScalers took different decisions: the run is not one training."""


def world() -> int:
    """The ranks of this run: 1 when no process group is up."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def join(device: str) -> torch.device:
    """Join the process group the launcher's environment describes (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, as torchrun sets them): gloo on a CPU,
    NCCL on CUDA with the local rank's device. Returns this rank's device."""
    dev = torch.device(device)
    if dev.type == "cuda":
        dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(dev)
    timeout = datetime.timedelta(seconds=_run_policy.COLLECTIVE_TIMEOUT_S)
    torch.distributed.init_process_group("nccl" if dev.type == "cuda" else "gloo", timeout=timeout)
    return dev


def spans_hosts() -> bool:
    """Whether this run's ranks are on more than one host (the user's launcher started
    fewer on this one than the group holds)."""
    n = world()
    return n > 1 and int(os.environ.get("LOCAL_WORLD_SIZE") or n) < n


def file_from_rank0(path: str) -> bytes:
    """The bytes of the file at ``path`` on rank 0's host, on every rank (two broadcasts:
    its length, then its bytes); :class:`~scalertune._errors.MissingEvidence` on every rank
    when rank 0 cannot read it."""
    from scalertune._errors import MissingEvidence

    data = b""
    if rank() == 0:
        try:
            with open(path, "rb") as f:
                data = f.read()
            size = len(data)
        except OSError:
            size = -1
    device = _collective_device()
    length = torch.tensor([size if rank() == 0 else 0], dtype=torch.int64, device=device)
    torch.distributed.broadcast(length, 0)
    if int(length) < 0:
        raise MissingEvidence(f"checkpoint {os.path.basename(path)} cannot be read on rank 0")
    if rank() == 0:
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        buffer = torch.empty(int(length), dtype=torch.uint8, device=device)
    torch.distributed.broadcast(buffer, 0)
    return data if rank() == 0 else buffer.cpu().numpy().tobytes()


def _collective_device() -> torch.device:
    """Where the group's tensors must be: this rank's GPU under NCCL, else the CPU."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def leave() -> None:
    """Tear the process group down (a rank that failed is killed by the launcher instead)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def reduce(tensor: torch.Tensor, op: str = "max") -> torch.Tensor:
    """``tensor`` reduced over the ranks in place (``max`` or ``sum``); itself with one."""
    if world() > 1:
        ops = {"max": torch.distributed.ReduceOp.MAX, "sum": torch.distributed.ReduceOp.SUM}
        torch.distributed.all_reduce(tensor, op=ops[op])
    return tensor


def agree(
    losses: Sequence[float], scales: Sequence[float], skipped: int, first_step: int
) -> list[float]:
    """A window's losses averaged over the ranks, once the ranks are seen to agree on every
    step's loss scale and on the steps skipped so far (one ``all_gather`` per window);
    :class:`RanksDisagree` naming the first step where they do not."""
    n = world()
    if n == 1:
        return list(losses)
    mine = torch.tensor([*losses, *scales, float(skipped)], dtype=torch.float64)
    rows = [torch.empty_like(mine) for _ in range(n)]
    torch.distributed.all_gather(rows, mine)
    table = torch.stack(rows)
    k = len(losses)
    decided = table[:, k:]
    differs = (decided != decided[0]).any(dim=0).nonzero()
    if len(differs):
        column = int(differs[0])
        what = (
            "skipped steps so far"
            if column == len(scales)
            else f"loss scale after step {first_step + column + 1}"
        )
        values = ", ".join(f"rank {r}: {float(v):g}" for r, v in enumerate(decided[:, column]))
        raise RanksDisagree(
            f"the ranks' GradScalers disagree on the {what} ({values}): each rank decided "
            "on its own gradients (an FSDP1 model needs ShardedGradScaler, which scalertune "
            "gives an FSDP1-wrapped model; a scaler of the step's own is not shared)"
        )
    return table[:, :k].mean(dim=0).tolist()
