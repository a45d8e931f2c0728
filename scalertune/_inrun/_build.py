"""The runtime a result file describes, with its in-run check: what ``scalertune.load`` and
``scalertune.attach`` build."""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

import torch

from scalertune._amp._check import ACTIONS, AmpCheckWarning, CheckPolicy
from scalertune._amp._runtime import AmpRuntime
from scalertune._amp._schema import check_policy, prediction_of, read_result, runtime_parts
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
    guard, the watch and the in-run check its file asks for, each turned off by ``False``.

    The file is read once: the config, the guard, the watch, the check's policy and the study
    the run's record goes to (the check's :attr:`~InRunCheck.origin`) all come from the same
    bytes, even where a worker rewrites the file meanwhile."""
    path = os.fspath(path)
    data = read_result(path)
    parts: dict[str, Any] = runtime_parts(data, path, guard=guard, watch=watch, best_amp=best_amp)
    kind = parts.pop("best_amp")
    parts["check"] = in_run_check((data, path), check)
    if parts["check"] is not None and parts["config"].dtype == "float32":
        warnings.warn(nothing_to_check(path, kind), AmpCheckWarning, stacklevel=3)
    return AmpRuntime(**parts, device=device)


def nothing_to_check(path: str, best_amp: str | None) -> str:
    """The one line for an answer in float32: the in-run check compares with float32, so
    such a run has nothing to check; how to train the best AMP config the search found
    (``best_amp``: :func:`~scalertune._amp._schema.best_amp_kind`), where it found one."""
    said = (
        f"{path}: the answer trains in float32, so the in-run check, which compares with "
        "float32, has nothing to check"
    )
    if best_amp == "deepspeed":
        return (
            f"{said}; the best AMP config that held (evidence.best_amp) is DeepSpeed's fp16 "
            f"block, for DeepSpeed's engine: scalertune export {path} --best-amp --to "
            "deepspeed prints it"
        )
    if best_amp == "amp":
        return (
            f"{said}; the best AMP config that held (evidence.best_amp) trains checked with "
            f"best_amp=True: scalertune.load({path!r}, best_amp=True), or "
            f"scalertune.attach(trainer, {path!r}, best_amp=True)"
        )
    return f"{said}; no AMP config held in the search"


def in_run_check(result: tuple[dict[str, Any], str] | None, check: CheckArg) -> InRunCheck | None:
    """The in-run check ``check`` asks for (see :data:`CheckArg`), with the policy and the
    prediction of ``result`` (a result file's contents, as :func:`read_result` gave them, and
    its path; the defaults without a file)."""
    if check is False:
        return None
    policy, prediction = (
        (check_policy(*result), prediction_of(*result))
        if result is not None
        else (CheckPolicy(), None)
    )
    if isinstance(check, CheckPolicy):
        policy = check
    elif isinstance(check, str) and check in ACTIONS:
        policy = dataclasses.replace(policy, action=check)
    elif check is not None and check is not True:
        raise UsageError(
            f"check must be True, False, {', '.join(repr(a) for a in ACTIONS)} or a "
            f"CheckPolicy, got {shown(check)}"
        )
    return InRunCheck(policy, prediction=prediction, origin=result[0] if result else None)
