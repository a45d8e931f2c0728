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
from collections.abc import Callable
from typing import Any

from scalertune import _policy
from scalertune._amp._config import FLOAT8_BASELINES, AmpConfig, baselines
from scalertune._judge._answer import judge
from scalertune._judge._findings import Findings
from scalertune._judge._outcome import Outcome
from scalertune._judge._view import StudyView
from scalertune._search._horizon_jobs import HorizonJobs, Queued
from scalertune._search._progress import Progress
from scalertune._search._recommended import add_recommended, recommended_stored
from scalertune._search._references import References
from scalertune._search._replay_choice import differs, replay_choice
from scalertune._search._setup import Setup
from scalertune._search._trials import LIVE
from scalertune._storage._claims import Once
from scalertune._storage._names import (
    ROLE_BASELINE,
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_PHASE,
    ROLE_REPLAY,
)
from scalertune._storage._trial_record import (
    BASELINE_KEY,
    CLIP_KEY,
    CONFIRM_KEY,
    PHASE_KEY,
    REPLAY_KEY,
    Job,
)


class Jobs:
    """Queues and drains the once-per-study runs (see the module's docstring)."""

    def __init__(
        self,
        view: StudyView,
        setup: Setup,
        once: Once,
        references: References,
        progress: Progress,
        *,
        drain: Callable[[], None],
    ) -> None:
        self.view, self.study = view, view.study
        self.setup, self.once, self.references = setup, once, references
        self.progress, self.drain = progress, drain

    def findings(self) -> Findings:
        """What the study's runs show now (:func:`~scalertune._judge._answer.judge`, each
        finished trial read once over the search: :class:`~scalertune._judge._view.
        StudyView`)."""
        return judge(self.study, view=self.view)

    def baselines(self) -> None:
        jobs = [
            (self.job(ROLE_BASELINE, config, baseline=name), self.params(config))
            for name, config in self._baseline_configs().items()
        ]
        self.queue("baselines", jobs, BASELINE_KEY)

    def replay_choice(self) -> None:
        """The float16 setting the replay finds best over the horizon, when it beats
        PyTorch's defaults by more than the noise: one real run checks it."""
        result = self.findings()
        config = replay_choice(result, self.setup)
        jobs = [] if config is None else [(self.job(ROLE_REPLAY, config), self.params(config))]
        self.queue("replay", jobs, REPLAY_KEY)

    def phases(self) -> None:
        """The evidence over a long horizon (:class:`~scalertune._search._horizon_jobs.
        HorizonJobs`)."""
        if self.setup.long:
            HorizonJobs(self).run()

    def confirm(self) -> None:
        """Rerun the best candidate on the confirmation seeds; the next only if it fails (over
        a long horizon :meth:`phases` has confirmed in turn already)."""
        self._confirm_in_turn()

    def _confirm_in_turn(self) -> None:
        while (candidate := self.findings().next_to_confirm) is not None:
            self.confirm_one(candidate)

    def confirm_one(self, candidate: Outcome) -> None:
        params = self.view.trials()[candidate.number].params
        jobs = [
            (
                Job(ROLE_CONFIRM, confirms=candidate.number, seed=seed, config=candidate.config),
                params,
            )
            for seed in _policy.confirm_seeds(self.setup.seed)
        ]
        self.queue(f"confirm.{candidate.number}", jobs, CONFIRM_KEY)

    def float32_clip(self) -> None:
        """float32 clipped as the best AMP config is, when that differs from the workload's
        own clipping (and its phases, over a long horizon): a config can reach the target
        sooner because of its clip alone, and the verdict credits the precision only with
        what is its own; float32 with that clip may be the answer on this device."""
        best = self.findings().best_amp
        if best is None or best.config.clip_norm == self.setup.clip_norm:
            return
        config = AmpConfig(dtype="float32", clip_norm=best.config.clip_norm)
        job = Job(ROLE_FLOAT32_CLIP, clip_of=best.number, seed=self.setup.seed, config=config)
        self.queue(f"float32-clip.{best.number}", [(job, self.params(config))], CLIP_KEY)
        twin = self.findings().float32_clip
        if twin is not None and self.setup.long:
            self.queue(f"float32-clip-phases.{best.number}", self.phase_jobs([twin]), PHASE_KEY)

    def recommended(self) -> None:
        self.once(
            "recommended",
            lambda: add_recommended(self.view, self.setup),
            lambda: recommended_stored(self.view),
        )

    # -- queueing ---------------------------------------------------------------------------

    def queue(self, key: str, jobs: list[Queued], fields: tuple[str, ...]) -> None:
        """Queue ``jobs`` (each with its parameters) once per study, then run what is
        queued; ``fields``: the job's fields that name it (one of each is queued)."""

        def work() -> None:
            if any(job.role == ROLE_CONFIRM for job, _ in jobs):
                for seed in _policy.confirm_seeds(self.setup.seed):
                    self.references.target(seed)
            for job, params in jobs:
                if not self._exists(job, fields):
                    self.study.enqueue_trial(params, user_attrs=job.attrs())
                    self.progress.grow(1)

        self.once(key, work, lambda: all(self._exists(job, fields) for job, _ in jobs))
        self.drain()

    def phase_jobs(
        self,
        runs: list[Outcome],
        *,
        after: int = 0,
        result: Findings | None = None,
    ) -> list[Queued]:
        """Branches of ``runs`` at the windows from ``after`` on, but for windows a run from
        step 0 already judged (in ``result``)."""
        windows = [w for w in self.setup.windows if w[0] >= after]
        judged = (
            set()
            if result is None
            else {(n, p.start) for n, ps in result.phases.items() for p in ps if p.from_start}
        )
        return [
            (
                self.job(ROLE_PHASE, run.config, of=run.number, start=start, end=end),
                self.params(run.config),
            )
            for run in runs
            for start, end in windows
            if (run.number, start) not in judged
        ]

    def job(self, role: str, config: AmpConfig, **fields: Any) -> Job:
        """A job of the search's own seed (``fields``: the rest of :class:`Job`'s)."""
        return Job(role, seed=self.setup.seed, config=config, **fields)

    def params(self, config: AmpConfig) -> dict[str, Any]:
        """The point of the space that names ``config`` (a dtype alone when none does)."""
        bare = (
            config
            if config.clip_norm != self.setup.clip_norm
            else dataclasses.replace(config, clip_norm=None)
        )
        return self.setup.space.params_for(bare) or {"dtype": config.dtype}

    def _baseline_configs(self) -> dict[str, AmpConfig]:
        """PyTorch's defaults and the article's fix (and, where the space searches float8,
        torchao's defaults; in a float8 space those alone), with the float32 islands every run
        of the space has (the model needs them whatever the scaler does), clipped as the
        workload clips. The article's fix is trained only over a trial's horizon, and only
        where the replay of float32's gradients tells it from PyTorch's defaults beyond the
        noise: it starts 4 halvings lower, which saves at most those first back-offs, and a
        run that ties with the defaults' would cost a run to say so. Over a long horizon
        only PyTorch's defaults are trained (and branched as a finalist). Where the article's
        fix is not trained, the summary says what the replay predicts for it, at no
        training step."""
        space = self.setup.space
        float8 = FLOAT8_BASELINES if "float8" in space.dtypes else {}
        if space.float8_only:  # torchao's defaults alone
            return {n: self._baseline(c) for n, c in float8.items()}
        configs = {n: self._baseline(c) for n, c in baselines(space.deepspeed).items()}
        if self.setup.long or not self._replay_tells_apart(*configs.values()):
            del configs[list(configs)[1]]  # the article's scale
        return {**configs, **{n: self._baseline(c) for n, c in float8.items()}}

    def _baseline(self, config: AmpConfig) -> AmpConfig:
        """A baseline with the space's fixed islands, clipped as the workload clips."""
        islands = self.setup.space.fixed_islands
        return dataclasses.replace(config, fp32_modules=islands).with_clip(self.setup.clip_norm)

    def _replay_tells_apart(self, defaults: AmpConfig, other: AmpConfig) -> bool:
        """Whether the replay tells ``other`` from ``defaults`` (or cannot say: no trace)."""
        result = self.findings()
        return result.trace is None or differs(result.trace, defaults, other, result)

    def _exists(self, job: Job, key: tuple[str, ...]) -> bool:
        """Whether the study has the run ``job`` is, by the fields ``key``: queued, running,
        done, or failed on its own error (a crash or Ctrl-C leaves no error, and is run
        again; so is a run whose stored evidence is damaged)."""
        for t in self.view.sound(self.view.trials())[0]:
            records = self.view.records(t)
            if records.job.same(job, key) and (t.state in LIVE or records.marks.error is not None):
                return True
        return False
