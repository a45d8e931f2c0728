"""The evidence of a search over a horizon longer than a trial, finalist by finalist.

The finalists (and islands) are taken in the order the answer would take them, a dtype that
fell behind last, until one holds and is confirmed. The first is trained **from step 0** as
far into the horizon as ``HORIZON_COST_CAP`` allows, then continued to the horizon from its
own state where the cap allows that, or branched from the float32 reference's checkpoints for
the windows it did not reach; the next the same way while the cap allows, else branched at
every window (:mod:`scalertune._search._branch`). A run that falls behind rules out the other
configs of its dtype (:class:`~scalertune._judge._horizon.RuledOut`) and, once nothing else is
left, may propose an island.
"""

from __future__ import annotations

from typing import Any

from scalertune import _policy
from scalertune._judge._answer import judge
from scalertune._judge._findings import Findings
from scalertune._judge._horizon import precision
from scalertune._judge._outcome import Outcome
from scalertune._judge._phases import judged_end
from scalertune._search import _policy as _search_policy
from scalertune._search._island_choice import island_for
from scalertune._search._setup import Setup
from scalertune._storage._names import ROLE_ISLAND, ROLE_PHASE
from scalertune._storage._trial_record import ISLAND_KEY, PHASE_KEY, Job

#: A job to queue, with the point of the space it is.
Queued = tuple[Job, dict[str, Any]]


class HorizonJobs:
    """The horizon's part of :class:`~scalertune._search._jobs.Jobs` (see the module)."""

    def __init__(self, jobs: Any) -> None:  # _jobs.Jobs, which imports this module
        self.jobs = jobs

    def _findings(self) -> Findings:
        """What the study's runs show now, each finished trial read once over the search."""
        return judge(self.jobs.study, view=self.jobs.view)

    def run(self) -> None:
        """Over a long horizon, the evidence for each finalist (and island) in the order the
        answer would take them, a dtype that fell behind last, until one holds and is
        confirmed: the first trained from step 0 as far into the horizon as the cost cap
        allows (then continued to the horizon from its own state, or branched after), the
        next the same way while the cap allows, else branched at every window. Once only
        configs of a dtype that fell behind are left, each run that fell behind with the
        workload's clipping may propose an island (a late phase saying one module's
        precision limited the fit), which joins the queue."""
        while True:
            result = self._findings()
            if result.best_amp is not None:
                return
            run = next(iter(_undecided(result)), None)
            if (run is None or precision(run.config) in result.ruled) and self._islands(result):
                continue
            if run is None:
                return
            if result.holds(run) is None:
                self._evidence(run, result)
                if self._findings().holds(run) is None:
                    return  # its runs failed: nothing more to learn from it here
            else:
                self.jobs.confirm_one(run)

    def _islands(self, result: Findings) -> bool:
        """Propose the islands of the finalists that fell behind on evidence of their own;
        whether one was queued."""
        before = len(result.islands)
        for run in result.finalists:
            if result.holds(run) is False and result.phases.get(run.number):
                self.jobs.queue(
                    f"islands.{run.number}",
                    self._island_jobs(self._findings(), run),
                    ISLAND_KEY,
                )
        return len(self._findings().islands) > before

    def _evidence(self, run: Outcome, result: Findings) -> None:
        """``run`` from step 0 as far as the cap allows, then continued to the horizon from
        its own state where the cap allows that, else branched after; else branched."""
        end = _affordable_end(self.jobs.setup, result, run)
        if end is not None:
            self.jobs.queue(f"from-start.{run.number}", [self._from_start_job(run, end)], PHASE_KEY)
            result = self._findings()
            if result.holds(run) is False:
                return
            if end < self.jobs.setup.horizon and _can_continue(self.jobs.setup, result, end):
                self.jobs.queue(
                    f"continued.{run.number}", [self._continued_job(run, end)], PHASE_KEY
                )
                if self._findings().holds(run) is not None:
                    return
            after = end
        else:
            after = 0
        branches = self.jobs.phase_jobs([run], after=after, result=result)
        self.jobs.queue(f"branches.{run.number}", branches, PHASE_KEY)

    def _from_start_job(self, run: Outcome, end: int) -> Queued:
        job = self.jobs.job(
            ROLE_PHASE,
            run.config,
            of=run.number,
            start=0,
            end=end,
            save=self._own_checkpoint(run, end),
        )
        return job, self.jobs.params(run.config)

    def _continued_job(self, run: Outcome, start: int) -> Queued:
        job = self.jobs.job(
            ROLE_PHASE,
            run.config,
            of=run.number,
            start=start,
            end=self.jobs.setup.horizon,
            continues=self._own_checkpoint(run, start),
        )
        return job, self.jobs.params(run.config)

    def _own_checkpoint(self, run: Outcome, step: int) -> str:
        """The name of a finalist's own state at ``step``, saved by its run from step 0 for
        its continuation, beside the reference's checkpoints in the study's artifact store."""
        return f"trial{run.number}-step{step}.pt"

    def _island_jobs(self, result: Findings, run: Outcome) -> list[Queued]:
        """The island a late phase proposes for ``run``, which fell behind with the workload's
        own clipping (a clip that hurts late is not the precision's doing), while the search
        has fewer than ``ISLANDS_PER_SEARCH``; the check runs in the worker that holds the
        claim."""
        if (
            len(result.islands) >= _search_policy.ISLANDS_PER_SEARCH
            or run.config.clip_norm != self.jobs.setup.clip_norm
            or self.jobs.setup.space.deepspeed  # DeepSpeed casts the whole model: no island
        ):
            return []
        config = island_for(result, run, self.jobs.setup, self.jobs.references)
        if config is None:
            return []
        job = self.jobs.job(ROLE_ISLAND, config, island_of=run.number)
        return [(job, self.jobs.params(run.config))]


def _undecided(result: Findings) -> list[Outcome]:
    """The finalists and islands, in the answer's order but a dtype that fell behind last,
    up to the first that holds and is confirmed: those whose evidence or confirmation is
    still to come."""
    runs = {o.number for o in [*result.finalists, *result.islands]}
    out = []
    # a dtype that fell behind goes last, its islands too: a config of another dtype,
    # untouched, is likelier to hold than one module of a failing one patched (on a new
    # user's MLP an island held through its windows and ended 1.7-2.3x behind float32 from
    # step 0, where PyTorch's float16 defaults ended at 0.59-1.01x)
    for c in sorted(result.pool, key=lambda c: precision(c.config) in result.ruled):
        if (
            c.number not in runs
            or result.holds(c) is False
            or (result.confirmation_state(c) == "failed")
        ):
            continue
        if result.holds(c) and result.confirmation_state(c) == "confirmed":
            break
        out.append(c)
    return out


def _affordable_end(setup: Setup, result: Findings, run: Outcome) -> int | None:
    """How far ``run`` may train from step 0: the latest step a window needs
    (:func:`~scalertune._judge._phases.judged_end`) such that it, branches over the windows
    after it and what the search has spent stay within ``HORIZON_COST_CAP`` horizons,
    keeping room for one more finalist from step 0 (through the first window, its
    confirmations and its later branches) while another is left; ``None`` when not even the
    first window fits."""
    windows = setup.windows

    def cost(end: int) -> int:
        return end + sum(e - s for s, e in windows if s >= end)

    ends = sorted({judged_end(*w) for w in windows}, reverse=True)
    confirm = len(_policy.CONFIRM_SEEDS) * setup.steps  # its own, still to come
    room = _search_policy.HORIZON_COST_CAP * setup.horizon - result.steps_trained - confirm
    others = [
        f
        for f in result.finalists
        if f.number != run.number and not any(p.from_start for p in result.phases.get(f.number, []))
    ]
    keep = cost(ends[-1]) + confirm if others else 0
    return next(
        (e for e in ends if cost(e) + keep <= room), ends[-1] if cost(ends[-1]) <= room else None
    )


def _can_continue(setup: Setup, result: Findings, end: int) -> bool:
    """Whether a run from step 0 that held to ``end`` may go on to the horizon from its own
    state within ``HORIZON_COST_CAP``, its confirmations still to come included: then it is
    one run from step 0 to the horizon, and its late windows need no branch."""
    confirm = len(_policy.CONFIRM_SEEDS) * setup.steps
    return (
        result.steps_trained + setup.horizon - end + confirm
        <= _search_policy.HORIZON_COST_CAP * setup.horizon
    )
