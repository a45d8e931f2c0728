"""Loading the user's workload: ``path/to/model.py:make_model`` or ``package.module:factory``.

The factory contract: ``make_model()`` returns a :class:`Workload` or a mapping with

- ``model``: an ``nn.Module`` with trainable parameters;
- ``optimizer``: a ``torch.optim.Optimizer`` over that model's parameters;
- ``loss_fn(output, target) -> scalar tensor`` (optional when ``step`` is given);
- ``batches``: a re-iterable of ``(inputs, targets)`` (a list, a DataLoader), not empty;
- ``step(model, batch, amp) -> loss`` (optional): the user's own AMP step body, written
  against the same :class:`~scalertune.AmpRuntime` that training code uses afterwards;
- ``clip_norm`` (optional): the gradient-clipping norm the user's float32 training already
  uses. The float32 reference clips with it; a model that explodes without clipping has no
  unclipped float32 run to compare with.

scalertune seeds Python's, NumPy's and torch's RNGs and calls the factory afresh for every run,
so every trial starts from the same weights and sees the same data order.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os
import random
import sys
from typing import Any, Callable, Iterable, Mapping

import torch

from scalertune._errors import UsageError

StepFn = Callable[[torch.nn.Module, Any, Any], torch.Tensor]


@dataclasses.dataclass
class Workload:
    """What a factory returns: the model, its optimizer, the loss and the data.

    Example:
        >>> import torch, scalertune
        >>> def make_model():
        ...     model = torch.nn.Linear(4, 1)
        ...     batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(4)]
        ...     return scalertune.Workload(
        ...         model=model,
        ...         optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        ...         loss_fn=torch.nn.functional.mse_loss,
        ...         batches=batches,
        ...     )
        >>> make_model().model.out_features
        1
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batches: Iterable[Any]
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
    step: StepFn | None = None
    clip_norm: float | None = None


_FIELDS = tuple(f.name for f in dataclasses.fields(Workload))


def seed_everything(seed: int) -> None:
    """Seed every RNG a factory or a DataLoader may draw from."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(seed)


def load_factory(spec: str | Callable[[], Any], *, isolated: bool = False) -> Callable[[], Any]:
    """Resolve ``FILE.py:NAME`` or ``package.module:NAME`` to the factory callable.

    A callable is taken as it is. With ``isolated`` (``--isolate``: every run in a fresh
    process) it must be a module-level function the child process can import again.
    """
    if callable(spec):
        if isolated:
            _check_importable(spec)
        return spec
    if not isinstance(spec, str):
        raise UsageError(f"the factory is a {type(spec).__name__}: give a function, or "
                         "'path/to/model.py:make_model'")
    module_part, sep, name = spec.rpartition(":")
    if not sep or not module_part or not name:
        raise UsageError(
            f"cannot read factory {spec!r}: write it as path/to/model.py:make_model "
            "or package.module:make_model"
        )
    if module_part.endswith(".py") or os.sep in module_part or "/" in module_part:
        module = _import_file(module_part)
    else:
        module = _import_module(module_part)
    factory = getattr(module, name, None)
    if factory is None:
        raise UsageError(f"{module_part} has no attribute {name!r}: name the factory function")
    if not callable(factory):
        raise UsageError(
            f"{module_part}:{name} is a {type(factory).__name__}, not callable: "
            "name a function that returns the workload"
        )
    return factory


def factory_name(spec: str | Callable[[], Any]) -> str:
    """How a factory is named in the study's settings: the spec as given, or, for a function,
    ``module:qualname`` (``script.py:qualname`` for one defined in the script being run)."""
    if isinstance(spec, str):
        return spec
    module = getattr(spec, "__module__", None) or "?"
    qualname = getattr(spec, "__qualname__", None) or type(spec).__name__
    if module == "__main__":
        script = getattr(sys.modules["__main__"], "__file__", None)
        module = os.path.basename(script) if script else module
    return f"{module}:{qualname}"


def _check_importable(factory: Callable[[], Any]) -> None:
    """A process started afresh finds the function again by its module and name, or not."""
    module = sys.modules.get(getattr(factory, "__module__", "") or "")
    qualname = getattr(factory, "__qualname__", "")
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not factory or (module is not None and module.__name__ == "__main__"
                                and not getattr(module, "__file__", None)):
        raise UsageError(
            f"--isolate runs every trial in a new process, which cannot import the factory "
            f"{factory_name(factory)} (a lambda, a nested function or one defined "
            "interactively): give 'path/to/model.py:make_model', or a module-level function")


def _import_file(path: str) -> Any:
    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path} (give the path to the file holding the factory)")
    path = os.path.abspath(path)
    module_name = "_scalertune_user_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    # The user's file may import its siblings, as it would when run as a script.
    sys.path.insert(0, os.path.dirname(path))
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the user's module: any error is theirs to fix
        sys.modules.pop(module_name, None)
        raise UsageError(f"importing {path} failed: {one_line(exc)}") from None
    return module


def _import_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise UsageError(
                f"no module named {name!r}: install it, or give a file path like "
                "model.py:make_model"
            ) from None
        raise UsageError(f"importing {name} failed: {one_line(exc)}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        raise UsageError(f"importing {name} failed: {one_line(exc)}") from None


def one_line(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        # A script's exit, run on import or from a factory: say which call, and the cure.
        return (f"SystemExit: sys.exit({exc.code!r}) was called (keep script code under "
                "if __name__ == '__main__':)")
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class FactoryError(Exception):
    """The user's factory raised; ``__cause__`` holds its exception."""


def build_workload(factory: Callable[[], Any], *, seed: int, device: torch.device) -> Workload:
    """Seed, call the factory, check what it returned, and move the model to ``device``.

    Raises :class:`UsageError` for a result of the wrong shape and :class:`FactoryError`
    when the factory itself raises.
    """
    seed_everything(seed)
    try:
        result = factory()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit, and the odd class derived from BaseException
        raise FactoryError(one_line(exc)) from exc
    workload = _coerce(result)
    _check(workload)
    workload.model.to(device)
    return workload


def _coerce(result: Any) -> Workload:
    if isinstance(result, Workload):
        return result
    if not isinstance(result, Mapping):
        raise UsageError(
            f"the factory returned a {type(result).__name__}: return a scalertune.Workload "
            f"or a dict with keys {', '.join(_FIELDS)}"
        )
    unknown = sorted(set(result) - set(_FIELDS))
    if unknown:
        raise UsageError(
            f"the factory returned unknown key(s) {', '.join(map(repr, unknown))}: "
            f"use {', '.join(_FIELDS)}"
        )
    missing = [k for k in ("model", "optimizer", "batches") if k not in result]
    if missing:
        raise UsageError(f"the factory's result lacks {', '.join(missing)}: return all of "
                         "model, optimizer, batches and loss_fn (or step)")
    return Workload(**result)


def _check(w: Workload) -> None:
    if not isinstance(w.model, torch.nn.Module):
        raise UsageError(f"'model' is a {type(w.model).__name__}: return a torch.nn.Module")
    if not isinstance(w.optimizer, torch.optim.Optimizer):
        raise UsageError(
            f"'optimizer' is a {type(w.optimizer).__name__}: return a torch.optim.Optimizer"
        )
    trainable = [p for p in w.model.parameters() if p.requires_grad]
    if not trainable:
        raise UsageError("the model has no trainable parameters: nothing to train")
    model_params = {id(p) for p in w.model.parameters()}
    if any(id(p) not in model_params for g in w.optimizer.param_groups for p in g["params"]):
        raise UsageError(
            "the optimizer holds parameters that are not the model's: build it on "
            "model.parameters() inside the factory"
        )
    if w.step is None and w.loss_fn is None:
        raise UsageError("the factory's result has neither 'loss_fn' nor 'step': give one")
    for name in ("loss_fn", "step"):
        value = getattr(w, name)
        if value is not None and not callable(value):
            raise UsageError(f"'{name}' is a {type(value).__name__}: it must be callable")
    if w.clip_norm is not None and (isinstance(w.clip_norm, bool) or not isinstance(
            w.clip_norm, (int, float)) or not w.clip_norm > 0):
        raise UsageError(f"'clip_norm' must be a positive number or None, got {w.clip_norm!r}")
    if w.step is not None and len(inspect.signature(w.step).parameters) != 3:
        raise UsageError("'step' must take (model, batch, amp) and return the loss")
    try:
        iterator = iter(w.batches)
    except TypeError:
        raise UsageError(
            f"'batches' is a {type(w.batches).__name__}: return a list or a DataLoader"
        ) from None
    if iterator is w.batches:
        raise UsageError(
            "'batches' is a one-shot iterator: return a list or a DataLoader that can be "
            "iterated again for every epoch"
        )
    if next(iterator, _EMPTY) is _EMPTY:
        raise UsageError("'batches' is empty: return at least one (inputs, targets) batch")


_EMPTY = object()


def to_device(obj: Any, device: torch.device) -> Any:
    """Move the tensors in a batch (nested tuples, lists, dicts) to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, Mapping):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj
