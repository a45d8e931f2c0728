"""The command line's names for the Python API's parameters, and the number checks it runs
before any work (with the same table the API uses, :mod:`scalertune._limits`)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar

from scalertune import _limits

_Record = TypeVar("_Record")

#: Python parameter -> the flag that sets it, where the flag is not ``--`` + its name.
_RENAMED = {
    "timeout_s": "--trial-timeout",
    "memory_gb": "--trial-memory",
    "factory": "FACTORY",
    "path": "RESULT",
}


def flag(parameter: str) -> str:
    """How the command line spells ``parameter`` (``n_trials`` -> ``--n-trials``)."""
    return _RENAMED.get(parameter, "--" + parameter.replace("_", "-"))


def _dest(parameter: str) -> str:
    """Where the parsed command line keeps the value of ``parameter``'s flag."""
    spelled = flag(parameter)
    return spelled[2:].replace("-", "_") if spelled.startswith("--") else parameter


def from_flags(record: type[_Record], args: argparse.Namespace, **given: Any) -> _Record:
    """The options ``record`` (a dataclass) of the command: each field the value of the flag
    that sets it (:func:`flag`), unless ``given``."""
    fields = dataclasses.fields(record)  # type: ignore[arg-type]  # a dataclass, said above
    flags = {f.name: getattr(args, _dest(f.name)) for f in fields if f.name not in given}
    return record(**flags, **given)


def check_numbers(args: argparse.Namespace) -> None:
    """Every number option of the command within its range, before anything loads torch;
    :class:`~scalertune._errors.ParameterError` names the first that is not."""
    command = args.command
    if command == "search":
        # each number the table bounds, from the flag that sets it, in the table's order
        _limits.check(
            _limits.SEARCH, **{name: getattr(args, _dest(name)) for name in _limits.SEARCH}
        )
        _limits.horizon(args.steps, args.horizon)
        _limits.check(_limits.REPORT, top=args.top)
    elif command == "diagnose":
        _limits.check(
            _limits.DIAGNOSE, init_scale=args.init_scale, steps=args.steps, seed=args.seed
        )
    elif command == "export":
        _limits.check(_limits.EXPORT, micro_batch_size=args.micro_batch_size)
    elif command == "report":
        _limits.check(_limits.REPORT, top=args.top, trial=args.trial)
    elif command == "dashboard":
        _limits.check(_limits.DASHBOARD, port=args.port)
