"""The runtime a result file describes, with its in-run check: what ``scalertune.load`` and
``scalertune.attach`` build."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from scalertune._amp._check import ACTIONS, CheckPolicy
from scalertune._amp._runtime import AmpRuntime
from scalertune._amp._schema import load_check, load_runtime
from scalertune._errors import UsageError
from scalertune._inrun._checker import InRunCheck
from scalertune._text import shown

#: What ``check=`` may be: the file's policy (``None``, ``True``), none (``False``), the
#: file's policy with another action, or a policy of its own.
CheckArg = bool | str | CheckPolicy | None


def runtime_from_yaml(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device | None = "auto",
    guard: bool = True,
    watch: bool = True,
    best_amp: bool = False,
    check: CheckArg = None,
) -> AmpRuntime:
    """The runtime for ``path``'s config (its best AMP config with ``best_amp``), with the
    guard, the watch and the in-run check its file asks for, each turned off by ``False``."""
    path = os.fspath(path)
    parts: dict[str, Any] = load_runtime(path, guard=guard, watch=watch, best_amp=best_amp)
    parts["check"] = in_run_check(path, check)
    return AmpRuntime(**parts, device=device)


def in_run_check(path: str | None, check: CheckArg) -> InRunCheck | None:
    """The in-run check ``check`` asks for (see :data:`CheckArg`), the file's policy and
    prediction read from ``path`` (the defaults without a file)."""
    if check is False:
        return None
    policy, prediction = load_check(path) if path is not None else (CheckPolicy(), None)
    if isinstance(check, CheckPolicy):
        policy = check
    elif isinstance(check, str) and check in ACTIONS:
        policy = dataclasses.replace(policy, action=check)
    elif check is not None and check is not True:
        raise UsageError(
            f"check must be True, False, {', '.join(repr(a) for a in ACTIONS)} or a "
            f"CheckPolicy, got {shown(check)}"
        )
    return InRunCheck(policy, prediction=prediction)
