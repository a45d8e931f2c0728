"""Restartable checkpoints of a run: the float32 reference's state at a phase of the horizon.

A branch from a checkpoint trains exactly as the reference would have from there, over the
same batches: the checkpoint holds the weights, the optimizer's state, the state of every
scheduler the workload declares, the data position and every RNG. The data position is the
RNG state at the start of the current pass over the batches and the index within that pass:
restoring it replays the pass's shuffling (a ``DataLoader`` draws its order from torch's RNG
when a pass begins) and skips to the index, so no batch is seen twice or missed. Batches
whose sampler is seeded per pass (``set_epoch``: ``DistributedSampler``, Accelerate's
seedable sampler) are told the pass number before each pass, as the frameworks' loops tell
them, and the number is saved with the position.

Checkpoints are files (``torch.save``), written whole or not at all, so a large model's
states never pile up in memory, and a reference that was interrupted resumes from its last;
a file can be handed on once written (to the study's artifact store, with its checksum). A
run saves at fixed steps and, over a long run, every few minutes of training
(:class:`SaveSchedule`). A file holds tensors and plain data only, and is read back without
running anything in it; one that is not a checkpoint of this workload is damaged
(:mod:`scalertune._run._checkpoint_file`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import torch

from scalertune._errors import DamagedCheckpoint, MissingEvidence, UsageError
from scalertune._run import _ranks
from scalertune._run._checkpoint_file import (
    ForeignValue,
    check_fits,
    read_checkpoint,
    restoring,
    write_checkpoint,
)
from scalertune._workload._contract import Workload
from scalertune._workload._deepspeed import EngineOptimizer
from scalertune._workload._rng import rng_state, set_rng_state


class BatchCursor(Iterator[Any]):
    """The workload's batches, cycled pass after pass, with a position that can be saved and
    restored (see the module's docstring)."""

    def __init__(self, batches: Any, *, saves: bool = True) -> None:
        """``saves=False``: the run saves no checkpoint, so the RNG state at the start of each
        pass (what :meth:`state` saves) is not taken: that is a copy of every generator's
        state per pass, a few percent of a small model's step when a pass is a few batches."""
        self.batches, self._saves = batches, saves
        self._pass: Iterator[Any] | None = None
        self._pass_rng: dict[str, Any] | None = None
        self._index = 0
        self._epoch = -1  # the pass in progress (its number, from 0)
        self._set_epoch = _epoch_setter(batches)

    def __next__(self) -> Any:
        while True:
            if self._pass is None:
                self._pass_rng = rng_state() if self._saves else None
                self._epoch += 1
                self._pass, self._index = self._begin(), 0
            try:
                batch = next(self._pass)
            except StopIteration:
                self._pass = None
                continue
            self._index += 1
            return batch

    def _begin(self) -> Iterator[Any]:
        """A new pass, its sampler told the pass number first."""
        if self._set_epoch is not None:
            self._set_epoch(self._epoch)
        return iter(self.batches)

    def state(self) -> dict[str, Any]:
        if not self._saves:
            raise RuntimeError("this cursor was made with saves=False: its position is not kept")
        return {"pass_rng": self._pass_rng, "index": self._index, "epoch": self._epoch}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a saved position; the RNGs are left as they were."""
        if state["pass_rng"] is None:  # saved before the first batch
            self._pass = None
            return
        now = rng_state()
        set_rng_state(state["pass_rng"])
        self._epoch = state.get("epoch", 0)  # checkpoints older than the pass number: 0
        self._pass_rng, self._pass = state["pass_rng"], self._begin()
        for _ in range(state["index"]):
            next(self._pass)
        self._index = state["index"]
        set_rng_state(now)


def _epoch_setter(batches: Any) -> Any:
    """What tells ``batches`` the pass number: its own ``set_epoch``, or, for a plain
    ``DataLoader`` over a ``DistributedSampler`` (each rank's shard, reshuffled per pass
    only when told the pass), its sampler's or batch sampler's, as Lightning's loop finds it
    (``_set_sampler_epoch``)."""
    for owner in (
        batches,
        getattr(batches, "sampler", None),
        getattr(getattr(batches, "batch_sampler", None), "sampler", None),
    ):
        found = getattr(owner, "set_epoch", None)
        if callable(found):
            return found
    return None


class CheckpointTarget(Protocol):
    """Where a checkpoint goes besides a plain file: written to ``local_path()``, then handed
    to ``publish`` (the study's artifact store, :mod:`scalertune._storage._checkpoints`)."""

    def local_path(self) -> str: ...
    def publish(self, path: str, step: int, written: tuple[str, int] | None = None) -> None: ...


class SaveSchedule(Mapping[int, "str | CheckpointTarget"]):
    """Where a run saves its state: at fixed steps, and, between them, once ``every_s``
    seconds of training have passed since the last save, into two slots in turn (the older
    is overwritten, so that a save cut short leaves the other). The training loop asks
    ``step in schedule`` after each read-back window and saves to ``schedule[step]``; each
    save restarts the clock."""

    def __init__(
        self,
        fixed: Mapping[int, str | CheckpointTarget],
        *,
        slots: tuple[CheckpointTarget, CheckpointTarget] | None = None,
        every_s: float = math.inf,
    ) -> None:
        self.fixed, self.slots, self.every_s = dict(fixed), slots, every_s
        self._last: float | None = None
        self._turn = 0

    def __contains__(self, step: object) -> bool:
        if step in self.fixed:
            return True
        if self.slots is None:
            return False
        now = time.monotonic()
        if self._last is None:  # the clock starts with the first window
            self._last = now
        return now - self._last >= self.every_s

    def __getitem__(self, step: int) -> str | CheckpointTarget:
        self._last = time.monotonic()
        if step in self.fixed:
            return self.fixed[step]
        if self.slots is None:
            raise KeyError(step)
        self._turn ^= 1
        return self.slots[self._turn]

    def __iter__(self) -> Iterator[int]:
        return iter(self.fixed)

    def __len__(self) -> int:  # a schedule with slots saves even without fixed steps
        return len(self.fixed) + (1 if self.slots is not None else 0)


def save_checkpoint(
    where: str | CheckpointTarget,
    workload: Workload,
    cursor: BatchCursor,
    *,
    step: int,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write the run's state after ``step`` steps to ``where``: a file (written atomically),
    or a :class:`CheckpointTarget` that stores it once written. With ranks, rank 0 writes
    it, with every rank's data position and RNGs (see :func:`_ranked_save`)."""
    mine = {"cursor": cursor.state(), "rng": rng_state()}
    if _ranks.world() > 1:
        saved = _ranked_save(workload, mine)
        if saved is None:
            return
        model, optimizer, ranks = saved
    else:
        model, optimizer, ranks = (
            workload.model.state_dict(),
            workload.optimizer.state_dict(),
            None,
        )
    state = {
        "step": step,
        "model": model,
        "optimizer": optimizer,
        "schedulers": [s.state_dict() for s in workload.schedulers],
        **mine,
        "ranks": ranks,
        "extra": extra or {},
    }
    path = where if isinstance(where, str) else where.local_path()
    try:
        written = write_checkpoint(state, path)
    except ForeignValue as exc:
        raise UsageError(
            f"cannot save the run's checkpoint: {exc}: a checkpoint holds tensors and plain "
            "data only (dict, list, tuple, str, numbers), so that reading it back runs no "
            "code: return those from the state_dict() of the workload's schedulers"
        ) from None
    except (OSError, RuntimeError) as exc:
        # a full disk, a read-only folder (torch's writer says a short write as a
        # RuntimeError): the store's fault, not the workload's; nothing is lost
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        describe = getattr(where, "describe", None)  # the store's name for it, not its scratch
        what = describe() if callable(describe) else f"checkpoint {path}"
        raise MissingEvidence(
            f"could not store {what} (step {step}): "
            f"{why.splitlines()[0] if why else type(exc).__name__}: free space or fix the "
            "artifact store, and rerun"
        ) from None
    if not isinstance(where, str):
        where.publish(path, step, written)


def _ranked_save(workload: Workload, mine: dict[str, Any]) -> tuple[Any, Any, Any] | None:
    """The whole model's and optimizer's state on rank 0, gathered through
    ``torch.distributed.checkpoint``'s state-dict API from DDP's replicas or FSDP's shards
    (DeepSpeed's engine through its own, :class:`EngineOptimizer`: a collective either way,
    every rank calls it), and each rank's data position and RNGs; None on the other ranks,
    which write nothing."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    if isinstance(workload.optimizer, EngineOptimizer):  # a collective of DeepSpeed's own
        model, optimizer = workload.model.state_dict(), workload.optimizer.state_dict()
    else:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model, optimizer = get_state_dict(workload.model, workload.optimizer, options=options)
    ranks: list[Any] = [None] * _ranks.world()
    torch.distributed.all_gather_object(ranks, mine)
    return (model, optimizer, ranks) if _ranks.rank() == 0 else None


def load_checkpoint(path: str, workload: Workload, cursor: BatchCursor) -> dict[str, Any]:
    """Put a freshly built ``workload`` and ``cursor`` in the state saved at ``path``;
    returns the checkpoint (``step``, ``extra``). With ranks, every rank reads the file (the
    ranks share a host; across hosts rank 0 reads it and sends its bytes to the others) and
    takes the whole state, its shard of it under FSDP, and its own data position and
    RNGs."""
    device = next(workload.model.parameters()).device
    if _ranks.spans_hosts():
        state = read_checkpoint(path, map_location=device, data=_ranks.file_from_rank0(path))
    else:
        state = read_checkpoint(path, map_location=device)
    with restoring(path):
        _restore(state, workload, cursor)
    return state


def _restore(state: dict[str, Any], workload: Workload, cursor: BatchCursor) -> None:
    """``state`` into ``workload`` and ``cursor``; a single process's checked first against
    the model and optimizer it is loaded into (:func:`check_fits`)."""
    if isinstance(workload.optimizer, EngineOptimizer):
        # DeepSpeed's engine: the whole model on each rank, in the run's dtype (a float32
        # reference's weights go into a float16 branch's model), and the optimizer's whole
        # state per parameter; what does not fit fails to load, a damaged checkpoint
        workload.model.load_state_dict(state["model"])
        workload.optimizer.load_state_dict(state["optimizer"])
        if state.get("ranks") is not None:
            state.update(state["ranks"][_ranks.rank()])
    elif state.get("ranks") is not None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(
            workload.model,
            workload.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=StateDictOptions(full_state_dict=True),
        )
        state.update(state["ranks"][_ranks.rank()])
    else:
        check_fits(state, workload.model, workload.optimizer)
        workload.model.load_state_dict(state["model"])
        # Read from the file at every call: load_state_dict keeps the given tensors where
        # dtype and device already match, so a state kept in memory and loaded twice would
        # be changed by the first branch's optimizer steps before the second began.
        workload.optimizer.load_state_dict(state["optimizer"])
    for scheduler, saved in zip(workload.schedulers, state["schedulers"]):
        scheduler.load_state_dict(saved)
    if len(state["schedulers"]) != len(workload.schedulers):
        raise DamagedCheckpoint(
            f"it holds {len(state['schedulers'])} schedulers' states, the workload has "
            f"{len(workload.schedulers)}"
        )
    cursor.restore(state["cursor"])
    set_rng_state(state["rng"])
