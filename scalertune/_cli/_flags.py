"""The command line's names for the Python API's parameters, and the number checks it runs
before any work (with the same table the API uses, :mod:`scalertune._limits`)."""

from __future__ import annotations

import argparse

from scalertune import _limits

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


def check_numbers(args: argparse.Namespace) -> None:
    """Every number option of the command within its range, before anything loads torch;
    :class:`~scalertune._errors.ParameterError` names the first that is not."""
    command = args.command
    if command == "search":
        _limits.check(
            _limits.SEARCH,
            n_trials=args.n_trials,
            steps=args.steps,
            horizon=args.horizon,
            seed=args.seed,
            timeout=args.timeout,
            timeout_s=args.trial_timeout,
            memory_gb=args.trial_memory,
            nproc_per_node=args.nproc_per_node,
            wait_for_storage=args.wait_for_storage,
            rendezvous_timeout=args.rendezvous_timeout,
            host_timeout=args.host_timeout,
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
