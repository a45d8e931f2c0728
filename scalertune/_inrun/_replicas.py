"""Whether N ranks train one model, or a copy each.

A factory that forgets DistributedDataParallel (or FSDP) trains a copy of the model per rank,
each on its own shard of the data, and no collective of a step says so: the losses, the
scaler's decisions and every prediction are then about a run the user's real training will
never be. After a step, the ranks' gradients (as ``amp.step`` receives them, all-reduced
under DDP or by a step of the user's own) and weights must agree; a model the ranks shard
(FSDP, FSDP2's DTensors, DeepSpeed's partitions) is not compared: each rank holds its own
part by design. The comparison is two float64 sums per parameter, gathered once: the search's
first float32 step makes it (and refuses copies), and the in-run check makes it on the
weights at each check (and warns once).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
from torch.distributed.tensor import DTensor

from scalertune._inrun._lines import heading

#: How far apart (relative) two ranks' sums may be and still be one model's: DDP's replicas
#: are equal to the bit; copies trained apart for one step differ by the update itself, which
#: is a learning rate's share of the weights, far above this.
_APART = 1e-6


class Replicas:
    """The ranks' copies of ``models``, compared (see the module's docstring)."""

    def __init__(self, models: Sequence[torch.nn.Module]) -> None:
        sharded = any(
            isinstance(m, (FSDPModule, FullyShardedDataParallel))
            for model in models
            for m in model.modules()
        )
        self._params = (
            []
            if _world() == 1 or sharded
            else [
                p
                for model in models
                for p in model.parameters()
                if not isinstance(p, DTensor) and p.numel()
            ]
        )
        self._grads = torch.zeros(0, dtype=torch.float64)

    def grads_ready(self) -> None:
        """Read the gradients as the optimizer step is about to use them (a parameter
        without one reads as zeros)."""
        self._grads = _moments(
            [
                p.grad if p.grad is not None else torch.zeros((), device=p.device)
                for p in self._params
            ]
        )

    def differing(self, *, grads: bool = True) -> list[int]:
        """The ranks whose gradients (with ``grads``) or weights differ from rank 0's (one
        ``all_gather``; every rank calls it)."""
        if not self._params:
            return []
        mine = _moments(self._params)
        if grads:
            read = self._grads if len(self._grads) else torch.zeros(2 * len(self._params))
            mine = torch.cat([read.double(), mine])
        mine = mine.to(self._params[0].device)
        rows = [torch.empty_like(mine) for _ in range(_world())]
        torch.distributed.all_gather(rows, mine)
        table = torch.stack(rows).cpu()
        apart = (table - table[0]).abs() > _APART * (table.abs() + table[0].abs())
        return [r for r in range(len(rows)) if bool(apart[r].any())]


class Copies:
    """The in-run check's look, at each check, at whether the ranks' weights are one model's
    (two sums per parameter, gathered once): the line the first time they differ, then no
    more looks."""

    def __init__(self) -> None:
        self._replicas: Replicas | None = None
        self._said = False

    def look(self, models: Sequence[torch.nn.Module], step: int) -> str | None:
        """The line to say at ``step``, if any (every rank calls it at the same step)."""
        if self._said:
            return None
        if self._replicas is None:  # the first check: every rank starts from the same weights
            self._replicas = Replicas(models)
            return None
        differing = self._replicas.differing(grads=False)
        if not differing:
            return None
        self._said = True
        return copies_line(differing, when=heading(step), what="weights")


def copies_line(ranks: Sequence[int], *, when: str, what: str) -> str:
    """The one line for ranks that train copies: which ranks, and what to do."""
    named = ", ".join(map(str, ranks))
    return (
        f"{when}, rank{'s' if len(ranks) > 1 else ''} {named}'s {what} differ from rank 0's: "
        "each rank trains a copy of its own, as the model is neither DistributedDataParallel "
        "nor FSDP and no step all-reduces its gradients; wrap it as your training script does "
        "(model = DistributedDataParallel(model)), or all-reduce the gradients in the step"
    )


def _world() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _moments(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Each tensor's sum and sum of squares, in float64 on the host (one transfer where the
    tensors share a device)."""
    if not tensors:
        return torch.zeros(0, dtype=torch.float64)
    with torch.no_grad():
        pairs = [torch.stack([t.double().sum(), t.double().square().sum()]) for t in tensors]
    if len({p.device for p in pairs}) > 1:
        return torch.cat([p.cpu() for p in pairs])
    return torch.cat(pairs).cpu()
