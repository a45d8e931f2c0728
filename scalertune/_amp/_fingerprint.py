"""Which model a result file was searched on: its parameters' names and shapes, as a
fingerprint the YAML's evidence carries (``evidence.model``), and the check, when training
code prepares a model with that file's runtime, that it is the same model.

A config is chosen for one model: its loss scale for that model's gradients, its islands for
its modules, its prediction (which the watch holds the run to) for its training. Loaded into
another model (another study's YAML, a layer added since), it runs in silence, and nothing
it claims holds. The check warns once, in one line, the first time the runtime prepares a
model (``amp.prepare``, the first ``amp.train_step``, ``scalertune.attach``).

The names are read as the user's model has them, whatever wraps it: DistributedDataParallel's
``module.``, ``torch.compile``'s ``_orig_mod.`` and FSDP1's and activation checkpointing's
wrapper names are left out, and a DTensor (FSDP2) or a DeepSpeed partition counts at its
whole shape. A model whose parameters are flattened (FSDP1 without ``use_orig_params``)
cannot be told apart, and is not checked.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from scalertune._amp._watch import caller_stacklevel

if TYPE_CHECKING:  # a report reads result files without loading torch
    import torch

#: Parts of a parameter's name that a wrapper adds, left out of the fingerprint.
_WRAPPERS = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def fingerprint(model: torch.nn.Module) -> dict[str, Any] | None:
    """``{"tensors", "values", "sha256"}`` of ``model``'s parameters (their count, how many
    values they hold, and a hash of their names and shapes); ``None`` for a model whose
    parameters are flattened (no names to tell)."""
    rows = []
    values = 0
    for name, p in model.named_parameters():
        if "_flat_param" in name:
            return None
        shape = tuple(getattr(p, "ds_shape", None) or p.shape)
        for part in _WRAPPERS:
            name = name.replace(part, "")
        rows.append(f"{name}:{'x'.join(map(str, shape))}")
        values += math.prod(int(n) for n in shape)
    digest = hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()[:16]
    return {"tensors": len(rows), "values": values, "sha256": digest}


def other_model(model: torch.nn.Module, searched: Mapping[str, Any], path: str) -> str | None:
    """One line when ``model`` is not the model ``path`` was searched on (``searched``, its
    ``evidence.model``); ``None`` when it is, or cannot be told."""
    mine = fingerprint(model)
    if mine is None or mine["sha256"] == searched.get("sha256"):
        return None
    return (
        f"{path} was searched on another model ({model_size(searched)}; this one has "
        f"{model_size(mine)}, named or shaped otherwise): its config and predictions are that "
        "model's; search this one (scalertune search) before relying on them"
    )


def model_size(found: Mapping[str, Any]) -> str:
    """A fingerprint in words: its parameter tensors and values."""
    tensors, values = found.get("tensors"), found.get("values")
    if not isinstance(tensors, int) or not isinstance(values, int):
        return "parameters of other names or shapes"
    return f"{tensors} parameter tensors, {values:,} values"


class ModelCheck:
    """Warns once, the first time it is called, when the model is not the one a result file
    was searched on (see the module's docstring), and when the training runs on another
    number of ranks than the search's runs did (``ranks``; where it has a fingerprint of no
    model, ``searched`` is ``None``)."""

    def __init__(
        self,
        searched: Mapping[str, Any] | None,
        path: str,
        ranks: tuple[int, int] | None = None,
    ) -> None:
        self.searched, self.path, self.ranks = searched, path, ranks

    def __call__(self, model: torch.nn.Module) -> None:
        found = None if self.searched is None else other_model(model, self.searched, self.path)
        if found is not None:
            warnings.warn(found, UserWarning, stacklevel=caller_stacklevel())
        found = other_world(self.ranks, self.path)
        if found is not None:
            warnings.warn(found, UserWarning, stacklevel=caller_stacklevel())


def searched_world(data: Mapping[str, Any]) -> tuple[int, int] | None:
    """The ranks per host and the hosts a result file's runs trained on, from
    ``evidence.nproc_per_node`` and ``evidence.nnodes`` (1 where it names either not);
    ``None`` where they are not counts."""
    evidence = data.get("evidence")
    evidence = evidence if isinstance(evidence, Mapping) else {}
    per, nodes = evidence.get("nproc_per_node", 1), evidence.get("nnodes", 1)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (per, nodes)):
        return None
    return per, nodes


def other_world(searched: tuple[int, int] | None, path: str) -> str | None:
    """The line to warn when this training's ranks (its process group, else the launcher's
    ``WORLD_SIZE``) are not the ``searched`` ones (ranks per host, hosts), where the search
    ran on more than one: its scaler sees another global batch's gradients than the
    search's runs did."""
    import os

    import torch

    if searched is None or searched[0] * searched[1] == 1:  # one process's answer used on N:
        return None  # said by the docs (distributed guide), not at every multi-GPU training
    (per, nodes), dist = searched, torch.distributed
    ranks = (
        dist.get_world_size()
        if dist.is_available() and dist.is_initialized()
        else int(os.environ.get("WORLD_SIZE") or 1)
    )
    if ranks == per * nodes:
        return None
    hosts = f" ({nodes} hosts x {per})" if nodes > 1 else ""
    return (
        f"{path} was searched on {per * nodes} ranks{hosts}, and this training runs on {ranks}: "
        "its loss scale and predictions are for another global batch's gradients; search "
        "under this training's launcher (scalertune search under torchrun or srun) before "
        "relying on them"
    )


def searched_model(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """``evidence.model`` of a result file's data, when it has a fingerprint there."""
    evidence = data.get("evidence")
    block = evidence.get("model") if isinstance(evidence, Mapping) else None
    return dict(block) if isinstance(block, Mapping) and "sha256" in block else None
