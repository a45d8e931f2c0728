"""The once-per-study runs of a search, queued as trials whoever gets there first.

- the two **baselines** (PyTorch's defaults and the seed article's ``init_scale=4096``);
- the **replay's choice**: the float16 scaler setting that the replay over the horizon finds
  best, trained once to check it, when it beats PyTorch's defaults by more than the noise;
- the **phases**: the leading config trained from step 0 as far into the horizon as the cost
  cap allows (the windows it does not reach branched); when it does not hold, the next
  finalist the same way while the cap allows, and every other finalist branched from the
  float32 reference's checkpoints for each window of the horizon, and, where one module's
  precision limited a late phase, the same config with that module in float32 (an island),
  trained from the start and branched too;
- the **confirmations** of the best candidate on other seeds (the next only if it fails);
- **float32 at the recommendation's clip**, when that differs from the workload's own;
- the **recommended** trial, the answer, where the dashboard looks.

Each is claimed (:class:`~scalertune._storage._claims.Once`), queued unless the study has it
already, and drained; a worker that finds the work claimed waits for it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import optuna

from scalertune import _policy
from scalertune._amp._config import BASELINES, AmpConfig
from scalertune._judge._phases import phase_windows
from scalertune._review._analyze import analyze
from scalertune._search._islands import island_for
from scalertune._search._progress import Progress
from scalertune._search._recommended import add_recommended, recommended_stored
from scalertune._search._references import References
from scalertune._search._replay_choice import replay_choice
from scalertune._search._setup import Setup
from scalertune._search._trials import LIVE
from scalertune._storage._claims import Once
from scalertune._storage._names import (
    ROLE_BASELINE,
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_ISLAND,
    ROLE_PHASE,
    ROLE_REPLAY,
)

_BASELINE_KEY = ("role", "baseline")
_CONFIRM_KEY = ("role", "confirms", "seed")
_CLIP_KEY = ("role", "clip_of", "seed")
_PHASE_KEY = ("role", "of", "start")
_ISLAND_KEY = ("role", "island_of")
_REPLAY_KEY = ("role",)


class Jobs:
    """Queues and drains the once-per-study runs (see the module's docstring)."""

    def __init__(self, study: optuna.Study, setup: Setup, once: Once, references: References,
                 progress: Progress, *, drain: Callable[[], None]) -> None:
        self.study, self.setup, self.once, self.references = study, setup, once, references
        self.progress, self.drain = progress, drain

    def baselines(self) -> None:
        jobs = [(self._job(ROLE_BASELINE, config, baseline=name), self._params(config))
                for name, config in self._baseline_configs().items()]
        self._queue("baselines", jobs, _BASELINE_KEY)

    def replay_choice(self) -> None:
        """The float16 setting the replay finds best over the horizon, when it beats
        PyTorch's defaults by more than the noise: one real run checks it."""
        result = analyze(self.study)
        config = replay_choice(result, self.setup)
        jobs = [] if config is None else [(self._job(ROLE_REPLAY, config),
                                           self._params(config))]
        self._queue("replay", jobs, _REPLAY_KEY)

    def phases(self) -> None:
        """Over a long horizon, the evidence for each finalist (and island) in the order the
        answer would take them, until one holds and is confirmed: the first trained from step
        0 as far into the horizon as the cost cap allows (the windows it does not reach
        branched), the next the same way while the cap allows, else branched at every window;
        one that does not hold may propose an island (a late phase saying one module's
        precision limited the fit), which joins the queue in its place."""
        if not self.setup.long:
            return
        while True:
            result = analyze(self.study)
            run = next(iter(_undecided(result)), None)
            if run is None:
                return
            held = result.holds(run)
            if held is None:
                self._evidence(run, result)
                if analyze(self.study).holds(run) is None:
                    return  # its runs failed: nothing more to learn from it here
                if analyze(self.study).holds(run) is False:
                    self._queue(f"islands.{run.number}", self._island_jobs(
                        analyze(self.study), run), _ISLAND_KEY)
            else:
                self._confirm_one(run)

    def _evidence(self, run: Any, result: Any) -> None:
        """``run`` from step 0 as far as the cap allows, branched after; else branched."""
        end = _affordable_end(self.setup, result, run)
        if end is not None:
            self._queue(f"from-start.{run.number}", [self._from_start_job(run, end)],
                        _PHASE_KEY)
            result = analyze(self.study)
            if result.holds(run) is False:
                return
            after = end
        else:
            after = 0
        self._queue(f"branches.{run.number}", self._phase_jobs([run], after=after,
                                                                 result=result), _PHASE_KEY)

    def confirm(self) -> None:
        """Rerun the best candidate on the confirmation seeds; the next only if it fails (over
        a long horizon :meth:`phases` has confirmed in turn already)."""
        self._confirm_in_turn()

    def _confirm_in_turn(self) -> None:
        while (candidate := analyze(self.study).next_to_confirm) is not None:
            self._confirm_one(candidate)

    def _confirm_one(self, candidate: Any) -> None:
        params = self.study.trials[candidate.number].params
        jobs = [({"role": ROLE_CONFIRM, "confirms": candidate.number, "seed": seed,
                  "config": candidate.config.to_dict()}, params)
                for seed in _policy.CONFIRM_SEEDS]
        self._queue(f"confirm.{candidate.number}", jobs, _CONFIRM_KEY)

    def _from_start_job(self, run: Any, end: int) -> tuple[dict[str, Any], dict[str, Any]]:
        return (self._job(ROLE_PHASE, run.config, of=run.number, start=0, end=end),
                self._params(run.config))

    def float32_clip(self) -> None:
        """float32 clipped as the best AMP config is, when that differs from the workload's
        own clipping (and its phases, over a long horizon): a config can reach the target
        sooner because of its clip alone, and the verdict credits the precision only with
        what is its own; float32 with that clip may be the answer on this device."""
        best = analyze(self.study).best_amp
        if best is None or best.config.clip_norm == self.setup.clip_norm:
            return
        config = AmpConfig(dtype="float32", clip_norm=best.config.clip_norm)
        job = {"role": ROLE_FLOAT32_CLIP, "clip_of": best.number, "seed": self.setup.seed,
               "config": config.to_dict()}
        self._queue(f"float32-clip.{best.number}", [(job, self._params(config))], _CLIP_KEY)
        twin = analyze(self.study).float32_clip
        if twin is not None and self.setup.long:
            self._queue(f"float32-clip-phases.{best.number}", self._phase_jobs([twin]),
                        _PHASE_KEY)

    def recommended(self) -> None:
        self.once("recommended", lambda: add_recommended(self.study, self.setup),
                  lambda: recommended_stored(self.study))

    def _island_jobs(self, result: Any, run: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """The island a late phase proposes for ``run``, which fell behind with the workload's
        own clipping (a clip that hurts late is not the precision's doing), while the search
        has fewer than ``ISLANDS_PER_SEARCH``; the check runs in the worker that holds the
        claim."""
        if (len(result.islands) >= _policy.ISLANDS_PER_SEARCH
                or run.config.clip_norm != self.setup.clip_norm):
            return []
        config = island_for(result, run, self.setup, self.references)
        return [] if config is None else [(self._job(ROLE_ISLAND, config, island_of=run.number),
                                           self._params(run.config))]

    # -- queueing ---------------------------------------------------------------------------

    def _queue(self, key: str, jobs: list[tuple[dict[str, Any], dict[str, Any]]],
               fields: tuple[str, ...]) -> None:
        """Queue ``jobs`` (attributes, parameters) once per study, then run what is queued."""
        def work() -> None:
            if any(job["role"] == ROLE_CONFIRM for job, _ in jobs):
                for seed in _policy.CONFIRM_SEEDS:
                    self.references.target(seed)
            for job, params in jobs:
                if not self._exists(job, fields):
                    self.study.enqueue_trial(params, user_attrs=job)
                    self.progress.grow(1)

        self.once(key, work, lambda: all(self._exists(job, fields) for job, _ in jobs))
        self.drain()

    def _phase_jobs(self, runs: list[Any], *, after: int = 0, result: Any = None,
                    ) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Branches of ``runs`` at the windows from ``after`` on, but for windows a run from
        step 0 already judged (in ``result``)."""
        windows = [w for w in phase_windows(self.setup.horizon, self.setup.steps)
                   if w[0] >= after]
        judged = set() if result is None else {
            (n, p.start) for n, ps in result.phases.items() for p in ps if p.from_start}
        return [(self._job(ROLE_PHASE, run.config, of=run.number, start=start, end=end),
                 self._params(run.config)) for run in runs for start, end in windows
                if (run.number, start) not in judged]

    def _job(self, role: str, config: AmpConfig, **attrs: Any) -> dict[str, Any]:
        return {"role": role, "seed": self.setup.seed, "config": config.to_dict(), **attrs}

    def _params(self, config: AmpConfig) -> dict[str, Any]:
        """The point of the space that names ``config`` (a dtype alone when none does)."""
        bare = config if config.clip_norm != self.setup.clip_norm else dataclasses.replace(
            config, clip_norm=None)
        return self.setup.space.params_for(bare) or {"dtype": config.dtype}

    def _baseline_configs(self) -> dict[str, AmpConfig]:
        """PyTorch's defaults and the article's fix, with the float32 islands every float16
        run of the space has (the model needs them whatever the scaler does), clipped as the
        workload clips. Over a long horizon only PyTorch's defaults are trained (and branched
        as a finalist): how any other scaler setting would do there, the article's fix
        included, is the replay's to say, at no training step."""
        islands = self.setup.space.fixed_islands
        names = ["pytorch-default"] if self.setup.long else list(BASELINES)
        return {name: dataclasses.replace(BASELINES[name], fp32_modules=islands).with_clip(
            self.setup.clip_norm) for name in names}

    def _exists(self, attrs: dict[str, Any], key: tuple[str, ...]) -> bool:
        """Whether the study has the run ``attrs`` describes: queued, running, done, or
        failed on its own error (a crash or Ctrl-C leaves no error, and is run again)."""
        return any(
            all(t.user_attrs.get(k) == attrs[k] for k in key)
            and (t.state in LIVE or "error" in t.user_attrs)
            for t in self.study.get_trials(deepcopy=False)
        )


def _undecided(result: Any) -> list[Any]:
    """The finalists and islands, in the answer's order, up to the first that holds and
    is confirmed: those whose evidence or confirmation is still to come."""
    runs = {o.number for o in [*result.finalists, *result.islands]}
    out = []
    for c in result.pool:
        if c.number not in runs or result.holds(c) is False or (
                result.confirmation_state(c) == "failed"):
            continue
        if result.holds(c) and result.confirmation_state(c) == "confirmed":
            break
        out.append(c)
    return out


def _affordable_end(setup: Setup, result: Any, run: Any) -> int | None:
    """How far ``run`` may train from step 0: the latest window end such that it,
    branches over the windows after it and what the search has spent stay within
    ``HORIZON_COST_CAP`` horizons, keeping room for one more finalist from step 0 (to the
    first window's end, its confirmations and its later branches) while another is left;
    ``None`` when not even the first window's end fits."""
    windows = phase_windows(setup.horizon, setup.steps)

    def cost(end: int) -> int:
        return end + sum(e - s for s, e in windows if s >= end)

    ends = sorted({e for _, e in windows}, reverse=True)
    room = _policy.HORIZON_COST_CAP * setup.horizon - result.steps_trained
    others = [f for f in result.finalists if f.number != run.number
              and not any(p.from_start for p in result.phases.get(f.number, []))]
    keep = (cost(ends[-1]) + len(_policy.CONFIRM_SEEDS) * setup.steps) if others else 0
    return next((e for e in ends if cost(e) + keep <= room),
                ends[-1] if cost(ends[-1]) <= room else None)
