"""float32 islands: modules that run with autocast off and their inputs in float32.

An island is a pair of forward hooks on the module, not a replaced ``forward``: the module
keeps its class, parameters and ``state_dict`` keys, and ``copy.deepcopy``, pickling and
``torch.compile`` carry the island along with the module it belongs to.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import torch

from scalertune._amp._modules import match_modules
from scalertune._amp._torch_private import forward_pre_hooks


def apply_islands(model: torch.nn.Module, entries: Iterable[str], device_type: str) -> None:
    """Make every module of ``model`` that ``entries`` name or match a float32 island
    (once: a module that is one already is left as it is)."""
    modules = dict(unwrapped(model).named_modules())
    for name in match_modules(entries, modules):
        if not is_island(modules[name]):
            make_island(modules[name], device_type)


def make_island(module: torch.nn.Module, device_type: str) -> list[Any]:
    """Make ``module`` a float32 island; returns the two hooks' handles (``remove()`` ends
    it: the in-run check tries an island for one pass)."""
    island = _Float32Island(device_type)
    return [
        module.register_forward_pre_hook(island.enter, with_kwargs=True),
        module.register_forward_hook(island.leave, always_call=True),
    ]


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The user's model inside torch.compile's and (Distributed)DataParallel's wrappers, whose
    names (``_orig_mod.``, ``module.``) are not the ones ``fp32_modules`` names."""
    while True:
        compiled = getattr(model, "_orig_mod", None)  # torch.compile's OptimizedModule
        if isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
            model = model.module
        elif isinstance(compiled, torch.nn.Module):
            model = compiled
        else:
            return model


def is_island(module: torch.nn.Module) -> bool:
    """Whether :meth:`AmpRuntime.prepare` made ``module`` a float32 island."""
    hooks = forward_pre_hooks(module)
    return any(
        isinstance(getattr(hook, "__self__", None), _Float32Island) for hook in hooks.values()
    )


#: The autocast-off contexts of the islands running now, innermost last, per thread (nested
#: islands, and DataParallel's threads, each leave their own).
_ACTIVE = threading.local()


def in_island() -> bool:
    """Whether a float32 island is running now, in this thread (a float8 layer inside one runs
    without float8)."""
    return bool(getattr(_ACTIVE, "contexts", None))


class _Float32Island:
    """The forward pre-hook and hook that run one module with autocast off.

    ``enter`` turns autocast off for ``device_type`` and casts the floating inputs to float32;
    ``leave`` (registered with ``always_call``, so it runs even when the forward raises)
    restores autocast as it was. Both are methods of a plain object holding only the device
    type, so deepcopy and pickle copy it with the module; neither refers to the module, which
    the hooks receive on every call. torch.compile runs them outside the graph, as it does
    other Python-state side effects, and compiles the module's forward in float32.
    """

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type

    @torch.compiler.disable
    def enter(
        self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        off = torch.autocast(self.device_type, enabled=False)
        off.__enter__()
        if not hasattr(_ACTIVE, "contexts"):
            _ACTIVE.contexts = []
        _ACTIVE.contexts.append((module, off))
        return _to_float32(args), _to_float32(kwargs)

    @torch.compiler.disable
    def leave(self, module: torch.nn.Module, _args: Any, _output: Any) -> None:
        contexts = getattr(_ACTIVE, "contexts", [])
        # An earlier pre-hook that raised skips ``enter`` but not this always-called hook.
        if contexts and contexts[-1][0] is module:
            contexts.pop()[1].__exit__(None, None, None)


def _to_float32(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.is_floating_point() else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return type(obj)(*(_to_float32(o) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_float32(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_float32(v) for k, v in obj.items()}
    return obj
