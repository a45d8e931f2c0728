"""What a checkpoint file may hold, and reading one without running anything in it.

A checkpoint crosses the study's artifact store, which others may write to (a shared folder,
a bucket): what is read back from there is data, never code. So a checkpoint holds tensors
and plain data only (``dict``, ``list``, ``tuple``, ``set``, ``str``, ``bytes``, numbers,
``None``, ``torch.dtype``, ``torch.device``, ``torch.Size``, the ``OrderedDict`` of a
``state_dict``), and is read with ``torch.load(weights_only=True)``, whose unpickler builds
those types and refuses every other global a file asks for. No type is added to torch's own
list: what scalertune saves is made plain before it is written (the run's record and config
as dicts, NumPy's random state as a list of ints), and a state the user's code returns with
anything else in it (a scheduler's ``state_dict()`` holding a NumPy number, an object of its
own) is refused when it is saved, naming where, rather than written into a file that could
not be read back.

A file that is not a scalertune checkpoint (another format, a pickle that asks for anything
else, a state missing its parts) raises :class:`~scalertune._errors.DamagedCheckpoint` when
read (:func:`read_checkpoint`), and so does one saved from another model (its keys, shapes or
dtypes, or its optimizer's parameters, are not the workload's: :func:`check_fits`). Its
caller passes it over for an earlier checkpoint or step 0: it is missing evidence, never a
crash and never a verdict.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import os
import pickle
import warnings
from collections.abc import Iterator, Mapping
from typing import IO, Any, cast

import torch

from scalertune._amp._schema import create_temporary
from scalertune._errors import DamagedCheckpoint
from scalertune._text import cut

#: What a checkpoint holds besides tensors: the types ``torch.load(weights_only=True)``
#: builds without being told of any other.
PLAIN = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.dtype,
    torch.device,
    torch.Size,
)
#: The parts of a checkpoint (:func:`scalertune._run._checkpoint.save_checkpoint`).
PARTS = ("step", "model", "optimizer", "schedulers", "cursor", "rng", "ranks", "extra")
#: How deep a checkpoint's data nests at most: a state dict is a few levels deep; a file
#: nested deeper is not one (and would exhaust the stack of a reader walking it).
_DEEPEST = 64


class ForeignValue(TypeError):
    """A state to be saved holds a value that is neither a tensor nor plain data."""


def check_plain(value: Any, where: str = "the checkpoint", depth: int = 0) -> None:
    """:class:`ForeignValue` naming the first value in ``value`` that is neither a tensor nor
    plain data, and where it is (``schedulers[0]['best']``)."""
    if depth > _DEEPEST:
        raise ForeignValue(f"{where} nests more than {_DEEPEST} levels deep")
    if isinstance(value, torch.Tensor) and type(value) in (torch.Tensor, torch.nn.Parameter):
        return
    if isinstance(value, PLAIN) and type(value) in PLAIN:
        return
    if type(value) in (dict, collections.OrderedDict):
        for key, item in value.items():
            if not (isinstance(key, PLAIN) and type(key) in PLAIN):
                raise ForeignValue(f"{where} has a key of type {_name(key)}")
            check_plain(item, f"{where}[{key!r}]", depth + 1)
        return
    if type(value) in (list, tuple, set, frozenset):
        for i, item in enumerate(value):
            check_plain(item, f"{where}[{i}]", depth + 1)
        return
    raise ForeignValue(f"{where} is a {_name(value)}")


def _name(value: Any) -> str:
    kind = type(value)
    module = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
    return module + kind.__qualname__


def write_checkpoint(state: dict[str, Any], path: str) -> tuple[str, int]:
    """``state`` to ``path``, whole or not at all, once checked to hold only what
    :func:`read_checkpoint` reads back (:class:`ForeignValue` otherwise, nothing written).

    Returns:
        The SHA-256 of the bytes written and their count, taken as they were written: a
        file swapped in before it is stored does not get its own bytes vouched for.
    """
    check_plain(state)
    fd, tmp = create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            written = _Hashing(f)
            torch.save(state, cast(IO[bytes], written))  # it writes through write() alone
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return written.sha.hexdigest(), written.size


class _Hashing:
    """A file that hashes what is written to it (``torch.save`` writes through ``write``)."""

    def __init__(self, f: Any) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = self.f.write(view)
        self.sha.update(view)
        self.size += view.nbytes
        return n if n is not None else view.nbytes

    def flush(self) -> None:
        self.f.flush()


def read_checkpoint(
    path: str,
    *,
    map_location: Any = "cpu",
    step: int | None = None,
    mmap: bool = False,
    data: bytes | None = None,
) -> dict[str, Any]:
    """The checkpoint at ``path``, read without running anything in it, and checked to be
    one (its parts, and ``step`` when given); :class:`DamagedCheckpoint` naming what is
    wrong otherwise. ``mmap``: the tensors stay in the file until used (a check that reads
    the structure alone). ``data``: the file's bytes, as another rank read them."""
    name = os.path.basename(path)
    try:
        source: Any = path if data is None else io.BytesIO(data)
        with warnings.catch_warnings():
            # a pickle of another protocol than torch.save's: torch's advice to file an issue,
            # which would precede the one line below
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            state = torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as exc:  # not torch's format, or a pickle asking for anything else
        raise DamagedCheckpoint(f"checkpoint {name} is damaged: {_unreadable(exc)}") from None
    why = _what_is_wrong(state, step)
    if why is not None:
        raise DamagedCheckpoint(f"checkpoint {name} is damaged: {why}")
    return dict(state)


def _what_is_wrong(state: Any, step: int | None) -> str | None:
    if not isinstance(state, dict):
        return f"it holds a {type(state).__name__}, not a checkpoint's parts"
    missing = [part for part in PARTS if part not in state]
    if missing:
        return f"it has no {', '.join(missing)}"
    if type(state["step"]) is not int or state["step"] < 0:
        return f"its step is {state['step']!r}"
    if step is not None and state["step"] != step:
        return f"it holds step {state['step']}, not step {step}"
    shapes = {
        "model": Mapping,
        "optimizer": Mapping,
        "schedulers": list,
        "cursor": Mapping,
        "rng": Mapping,
        "extra": Mapping,
    }
    wrong = [part for part, kind in shapes.items() if not isinstance(state[part], kind)]
    if wrong:
        return f"its {', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} not what a run saves"
    if state["ranks"] is not None and not isinstance(state["ranks"], list):
        return "its ranks are not what a run saves"
    return None


def check_fits(state: Mapping[str, Any], model: torch.nn.Module, optimizer: Any) -> None:
    """:class:`DamagedCheckpoint` unless ``state`` (one process's, as
    :func:`read_checkpoint` returns it) was saved from this model and optimizer: the same
    keys, each tensor of the same shape and dtype, the same parameter groups and sizes."""
    ours = model.state_dict()
    theirs = state["model"]
    if set(ours) != set(theirs):
        extra, lost = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
        said = [("keys this model lacks:", extra), ("this model's keys it lacks:", lost)]
        raise DamagedCheckpoint(
            "it was saved from another model: "
            + "; ".join(f"{label} {', '.join(map(str, keys[:3]))}" for label, keys in said if keys)
        )
    for key, tensor in ours.items():
        saved = theirs[key]
        if isinstance(tensor, torch.Tensor) and (
            not isinstance(saved, torch.Tensor)
            or saved.shape != tensor.shape
            or saved.dtype != tensor.dtype
        ):
            found = (
                f"{tuple(saved.shape)} {saved.dtype}"
                if isinstance(saved, torch.Tensor)
                else type(saved).__name__
            )
            raise DamagedCheckpoint(
                f"it was saved from another model: {key} is {found}, this model's "
                f"{tuple(tensor.shape)} {tensor.dtype}"
            )
    _check_optimizer(state["optimizer"], optimizer)


def _check_optimizer(saved: Mapping[str, Any], optimizer: Any) -> None:
    groups = saved.get("param_groups")
    ours = [list(group["params"]) for group in optimizer.param_groups]
    if not isinstance(groups, list) or [len(_params(g)) for g in groups] != [len(g) for g in ours]:
        raise DamagedCheckpoint("its optimizer's parameter groups are not this optimizer's")
    shapes: dict[Any, torch.Size] = {}
    for group, saved_group in zip(ours, groups):
        shapes.update(zip(_params(saved_group), (p.shape for p in group)))
    state = saved.get("state")
    if not isinstance(state, Mapping) or not set(state) <= set(shapes):
        raise DamagedCheckpoint("its optimizer's state is not this optimizer's")
    for index, values in state.items():
        tensors = values.values() if isinstance(values, Mapping) else ()
        for value in tensors:
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != shapes[index]:
                raise DamagedCheckpoint(
                    f"its optimizer's state for parameter {index} is {tuple(value.shape)}, "
                    f"the parameter {tuple(shapes[index])}"
                )


def _params(group: Any) -> list[Any]:
    return list(group.get("params", [])) if isinstance(group, Mapping) else []


@contextlib.contextmanager
def restoring(path: str) -> Iterator[None]:
    """Whatever fails inside, while a checked checkpoint's state is put into a workload (a
    value its checks could not see: a scheduler's state, an RNG's, a data position past the
    batches), is a :class:`DamagedCheckpoint` naming the file."""
    try:
        yield
    except DamagedCheckpoint as exc:
        raise DamagedCheckpoint(f"checkpoint {os.path.basename(path)} is damaged: {exc}") from None
    except Exception as exc:
        raise DamagedCheckpoint(
            f"checkpoint {os.path.basename(path)} is damaged: its state does not load "
            f"({_first_line(exc)})"
        ) from None


def _unreadable(exc: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in a few words: the global its
    pickle asks for (torch's own message around it advises loading it with
    ``weights_only=False``, which is what must never happen here)."""
    if isinstance(exc, pickle.UnpicklingError):
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        asked = [line for line in lines if "GLOBAL" in line or "nsupported" in line]
        return "its pickle asks for more than tensors and plain data" + (
            f" ({cut(asked[0].rstrip('.'), 200)})" if asked else ""
        )
    return f"it is not a file torch.save wrote ({_first_line(exc)})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {cut(first, 200)}" if first else type(exc).__name__
