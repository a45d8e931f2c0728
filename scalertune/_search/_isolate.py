"""Where the search's runs execute: in its own process, or in fresh ones.

With ``--isolate`` (or ``--nproc-per-node``) every run of the search goes through
:mod:`scalertune._search._launch`: the float32 references, the step timing, the trials, and
the replay that locates a forward overflow.

Runs in the search's own process go through :func:`run_here`: Ctrl-C stops them anywhere
(``_interrupt``), and a ``sys.exit()`` or ``os._exit()`` in the user's code fails the run
instead of ending the search with a trial left running (``os._exit(0)``: with exit 0 and
nothing written).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from scalertune import _interrupt
from scalertune._amp._config import AmpConfig
from scalertune._processes._protocol import TrialCrashed, describe_error, exited
from scalertune._run._loop import Plan
from scalertune._run._record import RunRecord
from scalertune._search._launch import forward_isolated, run_isolated
from scalertune._search._setup import Setup
from scalertune._workload._factory import exits_raised

_T = TypeVar("_T")


def run_here(run: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``run(*args, **kwargs)``, a run of the user's code in this process: Ctrl-C stops it at
    once, and ``sys.exit()`` or ``os._exit()`` in it raises :class:`TrialCrashed`."""
    try:
        with _interrupt.interruptible(), exits_raised():
            return run(*args, **kwargs)
    except SystemExit as exc:
        raise TrialCrashed(exited(exc)) from None
    except (KeyboardInterrupt, Exception):
        raise
    except BaseException as exc:  # a class the user's code derived from BaseException
        raise RuntimeError(describe_error(exc)) from exc


def execute(
    setup: Setup,
    config: AmpConfig,
    *,
    steps: int,
    seed: int,
    plan: Plan | None = None,
    stop: Any = None,
    on_window: Any = None,
) -> RunRecord:
    """Train ``config`` where the search's runs execute: in this process, or in a fresh one
    with ``--isolate`` (or its ranks). There the stop rule goes with the run and is asked
    after each window, as here, so a run stops at the same step wherever it trains; its
    record comes back whole, after the run, and the per-window callback sees only that."""
    if setup.isolation is not None:
        record = run_isolated(
            setup.spec,
            config,
            steps=steps,
            seed=seed,
            device=setup.device,
            timeout_s=setup.isolation.timeout_s,
            memory_gb=setup.isolation.memory_gb,
            plan=plan,
            stop=stop,
            ranks=setup.isolation.nproc_per_node,
        )
        if on_window is not None:
            on_window(record, 0)
        return record
    from scalertune._run._loop import run_config

    return run_here(
        run_config,
        setup.factory,
        config,
        steps=steps,
        seed=seed,
        device=setup.device,
        stop=stop,
        on_window=on_window,
        plan=plan,
    )


def forward(setup: Setup, config: AmpConfig, checkpoint: str, *, seed: int) -> float:
    """``config``'s forward loss over float32's at ``checkpoint``'s weights, where the
    search's runs execute (a factory that wraps its model for ranks builds it only there)."""
    if setup.isolation is not None:
        return forward_isolated(
            setup.spec,
            config,
            checkpoint,
            seed=seed,
            device=setup.device,
            timeout_s=setup.isolation.timeout_s,
            memory_gb=setup.isolation.memory_gb,
            ranks=setup.isolation.nproc_per_node,
        )
    from scalertune._run._forward import forward_ratio

    return run_here(
        forward_ratio, setup.factory, config, checkpoint, seed=seed, device=setup.device
    )
