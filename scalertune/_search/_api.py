"""search(): the whole pipeline, from a factory spec to a confirmed recommendation.

load the workload -> validate (one float32 step) -> open the study -> float32 reference and
step timing -> sampled trials -> baselines -> rank -> confirm the best on other seeds ->
recommended trial -> result.

Any number of workers may run the same search on one storage. The once-per-study work (the
references, the baselines, each confirmation, the recommended trial) is coordinated with
claims (:mod:`scalertune._storage._claims`); every run is an Optuna trial (:mod:`scalertune._search._trials`).
Everything the command line does goes through here.
"""

from __future__ import annotations

import dataclasses
import platform
import time
from typing import Any, Callable

import optuna
import torch
from optuna.trial import TrialState

from scalertune import _interrupt, _limits, _policy
from scalertune._amp._config import BASELINES, DTYPES, AmpConfig
from scalertune._amp._device import resolve_device
from scalertune._errors import SearchError, UsageError
from scalertune._judge._outcome import reference_of
from scalertune._judge._rank import tied
from scalertune._judge._stopping import study_stop_reason
from scalertune._review._result import SearchResult, analyze
from scalertune._run._preflight import preflight
from scalertune._search._progress import Progress
from scalertune._search._references import References
from scalertune._search._setup import Isolation, Setup
from scalertune._search._space import SearchSpace
from scalertune._search._study import DTYPE_DISTRIBUTION, default_study_name, open_study
from scalertune._search._trials import LIVE, TrialRunner, counted_search_trials
from scalertune._storage._claims import Once
from scalertune._storage._names import (
    CONSTRAINT_ATTR,
    CONSTRAINTS_ATTR,
    ROLE_BASELINE,
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_RECOMMENDED,
    ROLE_SEARCH,
    STOPPED_ATTR,
)
from scalertune._storage._open import DEFAULT_STORAGE, open_storage, storage_url
from scalertune._storage._recovery import recover, retry
from scalertune._storage._redact import redact
from scalertune._workload._loader import FactoryError, factory_name, load_factory

__all__ = ["Isolation", "SearchError", "describe_device", "search"]

_BASELINE_KEY = ("role", "baseline")
_CONFIRM_KEY = ("role", "confirms", "seed")
_CLIP_KEY = ("role", "clip_of", "seed")


def search(
    factory: str | Callable[[], Any],
    *,
    storage: str | None = None,
    study_name: str | None = None,
    space: str | SearchSpace = "default",
    fp32_modules: str | None = None,
    n_trials: int = 24,
    steps: int = 200,
    seed: int = 0,
    device: str | None = "auto",
    timeout: float | None = None,
    isolation: Isolation | None = None,
    log: Callable[[str], None] | None = None,
    progress: bool = False,
) -> SearchResult:
    """Search AMP configs for the workload ``factory`` returns; return the evidence.

    ``factory`` is ``path/to/model.py:make_model``, ``package.module:make_model``, or the
    factory function itself (the study is then named after its module and name).
    ``n_trials`` is the study's most sampled trials, across reruns and workers: running the
    same search again resumes it up to that total. The study stops sampling earlier once
    more trials are unlikely to find a faster config, or after ``timeout`` seconds. The
    float32 reference, the step timing and the two baselines (PyTorch's defaults, and the
    same with ``init_scale=4096``) run once per study. ``storage`` is an Optuna storage URL or
    a journal file path (several workers on one host). ``fp32_modules`` (``"attn.score,ffn"``)
    keeps those modules in float32 on every float16 trial: the follow-up a forward overflow
    calls for.

    Raises :class:`UsageError` for bad input before any study row is written, and
    :class:`SearchError` when the workload itself fails.

    Example:
        >>> import scalertune
        >>> result = scalertune.search("examples/classifier.py:make_model",
        ...                            storage="sqlite:///doc.db", n_trials=4,
        ...                            steps=60)  # doctest: +SKIP
        >>> result.config.dtype  # doctest: +SKIP
        'bfloat16'
    """
    _limits.check(_limits.SEARCH, n_trials=n_trials, steps=steps, seed=seed, timeout=timeout)
    space = space if isinstance(space, SearchSpace) else SearchSpace.load(space)
    if fp32_modules:
        space = space.with_islands(fp32_modules)
    dev = resolve_device(device)
    user_factory = load_factory(factory, isolated=isolation is not None)
    try:
        reference_config = preflight(user_factory, device=dev, seed=seed,
                                     islands=space.island_names)
    except FactoryError as exc:
        raise UsageError(f"the factory {factory_name(factory)} raised {exc}: fix it and "
                         "rerun") from None
    url = storage_url(storage or DEFAULT_STORAGE)
    study_name = study_name or default_study_name(factory)
    settings = {
        "factory": factory_name(factory), "steps": steps, "seed": seed,
        "space": space.to_dict(),
        "device_type": dev.type, "device": describe_device(dev),
        "reference": reference_config.to_dict(),
    }
    # From the first storage write on, Ctrl-C and SIGTERM stop the search at a safe point.
    with _interrupt.handled(), _interrupt.deferred():
        study, _ = open_study(open_storage(url, on_stale_trial=retry), study_name, settings, seed=seed, url=url,
                              space=space)
        setup = Setup(spec=factory, factory=user_factory, space=space, device=dev,
                      steps=steps, seed=seed, n_trials=n_trials,
                      clip_norm=reference_config.clip_norm, isolation=isolation)
        lines = Progress(log, bar=progress)
        if progress:
            lines.line(cost_estimate(space, n_trials=n_trials, steps=steps))
        worker = _Search(study, setup, reference_config, lines, timeout=timeout)
        try:
            worker.run()
            _interrupt.checkpoint()
        except KeyboardInterrupt:
            pass
        finally:
            lines.close()
        result = analyze(study, storage=redact(url))
        interrupted = _interrupt.received()
    return dataclasses.replace(result, interrupted=True) if interrupted else result


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"{device.type} ({platform.machine()}, {torch.get_num_threads()} threads)"


def cost_estimate(space: SearchSpace, *, n_trials: int, steps: int) -> str:
    """What a search will cost at most, in float32 runs of ``steps`` steps, said up front."""
    dtypes = len({"float32", *space.dtypes, "float16"})
    timing = dtypes * (_policy.WARMUP_WINDOWS + _policy.TIMING_ROUNDS) * _policy.READBACK_INTERVAL
    references = 1 + len(_policy.CONFIRM_SEEDS)
    confirmations = len(_policy.CONFIRM_SEEDS) * _policy.CONFIRM_TOP
    most = references + timing / steps + len(BASELINES) + n_trials + confirmations
    return (f"search cost: at most {most:.0f} float32 runs of {steps} steps ({references} float32 "
            f"references, step timing, up to {n_trials} sampled trials, {len(BASELINES)} "
            f"baselines, up to {confirmations} confirmation runs); runs stop at the target or "
            "as soon as they cannot win, and sampling stops when it stops finding faster "
            "configs, so most searches cost a fraction of that")


class _Search:
    """One worker's part in a search: the phases, in order; any number may share a study."""

    def __init__(self, study: optuna.Study, setup: Setup, reference: Any, progress: Progress,
                 *, timeout: float | None) -> None:
        self.study, self.setup, self.progress = study, setup, progress
        self.once = Once(study)
        self.references = References(
            study, self.once, setup.factory, reference, spec=setup.spec, steps=setup.steps,
            seed=setup.seed, device=setup.device,
            dtypes=[d for d in DTYPES if d in {*setup.space.dtypes, "float16"}],
            isolation=setup.isolation, log=progress.line)
        self.runner = TrialRunner(study, setup, self.references, progress)
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def run(self) -> None:
        recover(self.study, self.progress.line)
        self.references.target(self.setup.seed)
        trials = self.study.get_trials(deepcopy=False)
        self.progress.grow(sum(t.state == TrialState.WAITING for t in trials)
                           + max(0, self.setup.n_trials - counted_search_trials(trials)))
        while self._sample_more():
            self.runner.run_one()
        self._drain()
        self.once("baselines", self._queue_baselines,
                  lambda: all(self._exists(job, _BASELINE_KEY) for job in self._baselines()))
        self._drain()
        self._confirm()
        self._float32_with_the_same_clip()
        self.once("recommended", self._add_recommended, self._recommended_stored)

    # -- sampling ---------------------------------------------------------------------------

    def _sample_more(self) -> bool:
        recover(self.study, self.progress.line)
        trials = self.study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return True
        if counted_search_trials(trials) >= self.setup.n_trials:
            return False
        reason = self._stop_reason(trials)
        if reason is not None:
            if self.study.user_attrs.get(STOPPED_ATTR) != reason:
                self.study.set_user_attr(STOPPED_ATTR, reason)
                self.progress.line(f"sampling stopped: {reason}")
            return False
        return True

    def _stop_reason(self, trials: list[optuna.trial.FrozenTrial]) -> str | None:
        sampled = [t for t in trials if t.user_attrs.get("role") == ROLE_SEARCH
                   and t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
        distinct = self.setup.space.distinct_configs()
        if distinct is not None and len({_config_key(t) for t in sampled}) >= distinct:
            return f"the space has {distinct} distinct configs, and every one has run"
        reason = study_stop_reason([
            (t.user_attrs.get("time_to_target_s"), "duplicate_of" in t.user_attrs)
            for t in sampled])
        if reason is None and self.deadline is not None and time.monotonic() > self.deadline:
            reason = "the time budget (--timeout) is spent"
        return reason

    def _drain(self) -> None:
        """Run what is queued; wait for other workers' running trials (which may fail and
        come back as retries) until nothing is left."""
        while True:
            recover(self.study, self.progress.line)
            trials = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,
                                                                   TrialState.RUNNING))
            if any(t.state == TrialState.WAITING for t in trials):
                self.runner.run_one()
            elif trials:
                _interrupt.sleep(_policy.POLL_S)
            else:
                return

    # -- once per study ---------------------------------------------------------------------

    def _baseline_configs(self) -> dict[str, AmpConfig]:
        """PyTorch's defaults and the article's fix, with the float32 islands every float16
        run of the space has (the model needs them whatever the scaler does)."""
        islands = self.setup.space.fixed_islands
        return {name: dataclasses.replace(config, fp32_modules=islands)
                for name, config in BASELINES.items()}

    def _baselines(self) -> list[dict[str, Any]]:
        return [{"role": ROLE_BASELINE, "baseline": name, "seed": self.setup.seed,
                 "config": config.with_clip(self.setup.clip_norm).to_dict()}
                for name, config in self._baseline_configs().items()]

    def _queue_baselines(self) -> None:
        for job, config in zip(self._baselines(), self._baseline_configs().values()):
            params = self.setup.space.params_for(config) or {"dtype": config.dtype}
            self._ensure(job, _BASELINE_KEY, params)

    def _confirm(self) -> None:
        """Rerun the best candidate on the confirmation seeds; the next only if it fails."""
        while (candidate := analyze(self.study).next_to_confirm) is not None:
            params = self.study.trials[candidate.number].params
            jobs = [{"role": ROLE_CONFIRM, "confirms": candidate.number, "seed": seed,
                     "config": candidate.config.to_dict()} for seed in _policy.CONFIRM_SEEDS]

            def work(jobs: list[dict[str, Any]] = jobs,
                     params: dict[str, Any] = params) -> None:
                for seed in _policy.CONFIRM_SEEDS:
                    self.references.target(seed)
                for job in jobs:
                    self._ensure(job, _CONFIRM_KEY, params)

            self.once(f"confirm.{candidate.number}", work,
                      lambda jobs=jobs: all(self._exists(j, _CONFIRM_KEY) for j in jobs))
            self._drain()

    def _float32_with_the_same_clip(self) -> None:
        """float32 clipped as the recommendation is, on the search's seed, when that differs
        from the workload's own clipping: a config can reach the target sooner because of its
        clip alone, and the verdict must credit the precision only with what is its own."""
        rec = analyze(self.study).recommended
        if rec is None or rec.config.clip_norm == self.setup.clip_norm:
            return
        config = AmpConfig(dtype="float32", clip_norm=rec.config.clip_norm)
        job = {"role": ROLE_FLOAT32_CLIP, "clip_of": rec.number, "seed": self.setup.seed,
               "config": config.to_dict()}
        params = self.setup.space.params_for(config) or {"dtype": "float32"}
        self.once(f"float32-clip.{rec.number}", lambda: self._ensure(job, _CLIP_KEY, params),
                  lambda: self._exists(job, _CLIP_KEY))
        self._drain()

    def _add_recommended(self) -> None:
        """One more trial, role ``recommended``: the answer, where the dashboard looks.

        Its value is the least time to target among the runs it ties with (its own, its
        confirmations, and configs equally fast within the timing noise), less one part in a
        billion, so that optuna-dashboard's best trial (the least value) is this one.
        """
        result = analyze(self.study)
        rec = result.recommended
        if rec is None:
            ref = reference_of(self.study, self.setup.seed)
            value = result.reference_time_to_target
            params = {"dtype": "float32"}
            distributions = {"dtype": DTYPE_DISTRIBUTION}
            source = {"recommends": "float32", "reference_trial": ref["trial"] if ref else None}
        else:
            peers = [o for o in result.ranking if o.reached and (
                o.config == rec.config or tied(o, rec, result.step_times))]
            peers += [o for o in result.confirmations.get(rec.number, {}).values() if o.reached]
            value = min(o.time_to_target for o in peers) * (1 - 1e-9)
            frozen = self.study.trials[rec.number]
            params, distributions = frozen.params, frozen.distributions
            source = {"recommends": rec.number}
        speedup = result.speedup
        trial = optuna.trial.create_trial(
            state=TrialState.COMPLETE, value=value, params=params, distributions=distributions,
            user_attrs={"role": ROLE_RECOMMENDED, "config": result.config.to_dict(),
                        "seed": self.setup.seed, **source, "verdict": result.verdict,
                        "speedup_vs_float32": None if speedup is None else round(speedup.point, 3),
                        "time_to_target_s": (rec.time_to_target if rec
                                             else result.reference_time_to_target)},
            system_attrs={CONSTRAINT_ATTR: 0.0, CONSTRAINTS_ATTR: [0.0]})
        self.study.add_trial(trial)

    def _recommended_stored(self) -> bool:
        config = analyze(self.study).config.to_dict()
        return any(t.user_attrs.get("role") == ROLE_RECOMMENDED
                   and t.user_attrs.get("config") == config
                   for t in self.study.get_trials(deepcopy=False))

    def _exists(self, attrs: dict[str, Any], key: tuple[str, ...]) -> bool:
        """Whether the study has the run ``attrs`` describes: queued, running, done, or
        failed on its own error (a crash or Ctrl-C leaves no error, and is run again)."""
        return any(
            all(t.user_attrs.get(k) == attrs[k] for k in key)
            and (t.state in LIVE or "error" in t.user_attrs)
            for t in self.study.get_trials(deepcopy=False)
        )

    def _ensure(self, attrs: dict[str, Any], key: tuple[str, ...],
                params: dict[str, Any]) -> None:
        """Queue the run ``attrs`` describes unless the study has it already."""
        if not self._exists(attrs, key):
            self.study.enqueue_trial(params, user_attrs=attrs)
            self.progress.grow(1)


def _config_key(trial: optuna.trial.FrozenTrial) -> str:
    return repr(sorted(trial.user_attrs.get("config", {}).items()))

