"""Two ways a trial ends without a run of its own to judge: a twin already ran (its result is
reused), and a forward overflow whose modules are named by replaying the run."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from scalertune._amp._config import AmpConfig
from scalertune._diagnose._locate import locate_forward_overflow
from scalertune._errors import MissingEvidence
from scalertune._judge._judged import Judged, store
from scalertune._judge._outcome import Outcome
from scalertune._run._record import RunRecord
from scalertune._search._isolate import run_here
from scalertune._search._launch import locate_isolated
from scalertune._search._setup import Setup
from scalertune._search._study import store_constraint
from scalertune._storage._names import CONSTRAINT_ATTR
from scalertune._storage._trial_record import Marks


def reuse(trial: optuna.Trial, config: AmpConfig, original: FrozenTrial, progress: Any) -> float:
    """Finish ``trial`` with ``original``'s result: the same config already ran."""
    store(trial, Judged.of_trial(original))
    marks = Marks.of_trial(original)
    Marks(
        overflow_module=marks.overflow_module,
        overflow_islands=marks.overflow_islands,
        duplicate_of=original.number,
    ).write(trial)
    gap = original.system_attrs.get(CONSTRAINT_ATTR)
    if gap is not None:
        store_constraint(trial, gap)
    progress.line(
        f"#{trial.number} [{config.describe()}] is trial #{original.number}'s "
        "config: its result is reused, nothing trained"
    )
    progress.advance()
    if original.state == TrialState.PRUNED:
        raise optuna.TrialPruned(Outcome.from_trial(original).prune_reason)
    if original.value is None:  # Optuna stores a value with every complete trial
        raise MissingEvidence(f"trial #{original.number} is complete without its value")
    return float(original.value)


def locate_overflow(
    setup: Setup, trial: optuna.Trial, config: AmpConfig, seed: int, record: RunRecord
) -> None:
    """Name the modules where the forward overflowed, and the islands checked to fix it."""
    try:
        if setup.isolation is not None:
            advice = locate_isolated(
                setup.spec,
                config,
                record.losses,
                seed=seed,
                device=setup.device,
                timeout_s=setup.isolation.timeout_s,
                memory_gb=setup.isolation.memory_gb,
                ranks=setup.isolation.nproc_per_node,
            )
        else:
            advice = run_here(
                locate_forward_overflow,
                setup.factory,
                config,
                record.losses,
                seed=seed,
                device=setup.device,
            )
    except Exception:  # the diagnosis is a courtesy; the prune reason stands without it
        return
    if advice is not None:
        Marks(
            overflow_module=advice.where,
            overflow_islands=",".join(advice.islands) if advice.fixed else None,
        ).write(trial)
        record.prune_reason = (
            f"{record.prune_reason}; the modules whose own computation overflowed: {advice.where}"
        )
