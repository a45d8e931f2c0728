"""Steps that must leave the training's schedule where it was: the start-up probe and the step
timing run a workload's own step function, which may step its LR schedulers (a Lightning step
steps them after every step, taken or not), and a schedule with a length (``OneCycleLR``)
refuses to run past it."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

from scalertune._workload._contract import Workload


@contextlib.contextmanager
def kept_schedules(workload: Workload) -> Iterator[None]:
    """Whatever runs inside leaves the workload's schedulers, and the learning rates (and
    momenta) they set on the optimizer's parameter groups, as it found them."""
    schedules = [copy.deepcopy(s.state_dict()) for s in workload.schedulers]
    groups = [
        {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
        for g in workload.optimizer.param_groups
    ]
    try:
        yield
    finally:
        for scheduler, saved in zip(workload.schedulers, schedules):
            scheduler.load_state_dict(saved)
        for group, saved in zip(workload.optimizer.param_groups, groups):
            group.update(saved)
