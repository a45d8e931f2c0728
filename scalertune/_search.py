"""search(): the whole pipeline, from a factory spec to a confirmed recommendation.

load the workload -> validate (one float32 step) -> open the study -> float32 reference ->
baselines -> sampled trials -> rank -> confirm the best on other seeds -> result.

Any number of workers may run the same search on one storage. The once-per-study runs are
coordinated with claims (``_claims``); every other run is an Optuna trial taken with
``study.optimize`` (a queued trial first: a baseline, a confirmation, a retry), so Optuna's
heartbeats cover it. Everything the command line does goes through here.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import sys
import time
import traceback
from typing import Any, Callable

import optuna
import torch
from optuna.trial import TrialState

from scalertune import _policy
from scalertune._claims import claim, wait_released
from scalertune._config import BASELINES, AmpConfig
from scalertune._diagnose import first_overflowing_module
from scalertune._errors import UsageError
from scalertune._isolate import TrialCrashed, describe_error, run_isolated
from scalertune._judge import Target
from scalertune._rank import (ROLE_BASELINE, ROLE_CONFIRM, ROLE_SEARCH, SCALES_ATTR,
                              encode_scales)
from scalertune._recovery import recover
from scalertune._result import SearchResult, analyze
from scalertune._run import RunRecord, preflight, run_config
from scalertune._runtime import resolve_device
from scalertune._space import SearchSpace
from scalertune._storage import DEFAULT_STORAGE, WORKER, open_storage, redact
from scalertune._study import (add_reference, default_study_name,
                               judged_attrs, objective_value, open_study, reference_of)
from scalertune._workload import FactoryError, factory_name, load_factory

_LIVE = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED)
_BASELINE_KEY = ("role", "baseline")
_CONFIRM_KEY = ("role", "confirms", "seed")


class SearchError(Exception):
    """The search cannot go on: the workload itself is broken (not one config)."""


@dataclasses.dataclass(frozen=True)
class Isolation:
    """Run each trial in its own process: ``timeout_s`` and ``memory_gb`` bound it."""

    timeout_s: float | None = None
    memory_gb: float | None = None


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
    isolation: Isolation | None = None,
    log: Callable[[str], None] | None = None,
    progress: bool = False,
) -> SearchResult:
    """Search AMP configs for the workload ``factory`` returns; return the evidence.

    ``factory`` is ``path/to/model.py:make_model``, ``package.module:make_model``, or the
    factory function itself (the study is then named after its module and name).
    ``n_trials`` is the study's total of sampled trials, across reruns and workers: running
    the same search again resumes it up to that total. The float32 reference and the two
    baselines (PyTorch's defaults, and the same with ``init_scale=4096``) run once per study.
    ``storage`` is an Optuna storage URL or a journal file path (several workers on one host).
    ``fp32_modules`` (``"attn.score,ffn"``) keeps those modules in float32 on every float16
    trial: the follow-up a forward overflow calls for.

    Raises :class:`UsageError` for bad input before any study row is written, and
    :class:`SearchError` when the workload itself fails.

    Example:
        >>> import scalertune
        >>> result = scalertune.search("examples/classifier.py:make_model",
        ...                            storage="sqlite:///doc.db", n_trials=4,
        ...                            steps=60)  # doctest: +SKIP
        >>> result.config.dtype  # doctest: +SKIP
        'float16'
    """
    if n_trials < 0 or steps < _policy.READBACK_INTERVAL * 2:
        raise UsageError(f"--n-trials must be >= 0 and --steps >= {_policy.READBACK_INTERVAL * 2}")
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
    url = storage or DEFAULT_STORAGE
    study_name = study_name or default_study_name(factory)
    settings = {
        "factory": factory_name(factory), "steps": steps, "seed": seed, "space": space.to_dict(),
        "device_type": dev.type, "device": describe_device(dev),
        "reference": reference_config.to_dict(),
    }
    study = open_study(open_storage(url), study_name, settings, seed=seed, url=url)
    worker = _Worker(study, factory, user_factory, reference_config, space, dev, steps, seed,
                     n_trials, isolation, log or (lambda _: None), progress)
    interrupted = False
    try:
        worker.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        worker.close()
    result = analyze(study, storage=redact(url))
    return dataclasses.replace(result, interrupted=True) if interrupted else result


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"{device.type} ({platform.machine()}, {torch.get_num_threads()} threads)"


class _TrialFailed(Exception):
    """Raised out of the objective so that Optuna records the trial as failed."""


class _Worker:
    """One process's part in a search; any number of them may share the study."""

    def __init__(self, study: optuna.Study, spec: str, factory: Callable[[], Any],
                 reference: AmpConfig, space: SearchSpace, device: torch.device, steps: int,
                 seed: int, n_trials: int, isolation: Isolation | None,
                 log: Callable[[str], None], progress: bool) -> None:
        self.study, self.spec, self.factory = study, spec, factory
        self.reference, self.space, self.device = reference, space, device
        self.steps, self.seed, self.n_trials, self.isolation = steps, seed, n_trials, isolation
        self._bar = _bar() if progress else None
        # While a bar is drawn, lines must go through it or they tear it apart. (A bar with
        # total 0 is falsy: tqdm defines __len__, hence "is not None".)
        bar = self._bar
        self.log = (lambda line: bar.write(line, file=sys.stderr)) if bar is not None else log
        self._targets: dict[int, Target] = {}
        self._failures: list[str] = []
        self._any_success = False
        self._holding = False

    # -- the phases -------------------------------------------------------------------------

    def run(self) -> None:
        recover(self.study, self.log)
        self._once("setup", self._setup, self._setup_done)
        self.target(self.seed)
        trials = self.study.get_trials(deepcopy=False)
        self._grow(sum(t.state == TrialState.WAITING for t in trials)
                   + max(0, self.n_trials - _counted_search_trials(trials)))
        while self._more_main_trials():
            self._one_trial()
        self._drain()
        self.confirm()

    def confirm(self) -> None:
        """Rerun the best distinct candidates on the confirmation seeds (once per study)."""
        candidates = analyze(self.study).candidates
        jobs = [{"role": ROLE_CONFIRM, "confirms": c.number, "seed": seed,
                 "config": c.config.to_dict()}
                for c in candidates for seed in _policy.CONFIRM_SEEDS]

        def work() -> None:
            for seed in _policy.CONFIRM_SEEDS:
                self.target(seed)
            for job in jobs:
                self._ensure(job, _CONFIRM_KEY)

        self._once("confirm", work, lambda: all(self._exists(j, _CONFIRM_KEY) for j in jobs))
        self._drain()

    def _setup(self) -> None:
        self.target(self.seed)
        for job in self._baseline_jobs():
            self._ensure(job, _BASELINE_KEY)

    def _setup_done(self) -> bool:
        return reference_of(self.study, self.seed) is not None and all(
            self._exists(job, _BASELINE_KEY) for job in self._baseline_jobs())

    def _baseline_jobs(self) -> list[dict[str, Any]]:
        return [{"role": ROLE_BASELINE, "baseline": name, "seed": self.seed,
                 "config": config.to_dict()} for name, config in BASELINES.items()]

    def _once(self, key: str, work: Callable[[], None], done: Callable[[], bool]) -> None:
        """Do ``work`` in exactly one worker, unless ``done()`` already; the others wait."""
        while not done():
            if self._holding:  # inside another claim: nobody else can be doing this
                work()
                return
            with claim(self.study, key) as mine:
                if mine:
                    self._holding = True
                    try:
                        work()
                    finally:
                        self._holding = False
                    return
            wait_released(self.study, key)

    def _more_main_trials(self) -> bool:
        recover(self.study, self.log)
        trials = self.study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return True
        return _counted_search_trials(trials) < self.n_trials

    def _drain(self) -> None:
        """Run what is queued; wait for other workers' running trials (which may fail and
        come back as retries) until nothing is left."""
        while True:
            recover(self.study, self.log)
            trials = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,
                                                                   TrialState.RUNNING))
            if any(t.state == TrialState.WAITING for t in trials):
                self._one_trial()
            elif trials:
                time.sleep(_policy.POLL_S)
            else:
                return

    # -- once-per-study work ----------------------------------------------------------------

    def target(self, seed: int) -> Target:
        """The float32 target of ``seed``; runs and stores the reference if nobody has."""
        if seed not in self._targets:
            self._once(f"reference.{seed}", lambda: self._run_reference(seed),
                       lambda: reference_of(self.study, seed) is not None)
            reference = reference_of(self.study, seed)
            self._targets[seed] = Target.from_reference(reference["losses"])
        return self._targets[seed]

    def _run_reference(self, seed: int) -> None:
        self.log(f"float32 reference, seed {seed} ...")
        try:
            record = run_config(self.factory, self.reference, steps=self.steps, seed=seed,
                                device=self.device)
        except FactoryError as exc:
            raise SearchError(f"the float32 reference failed: the factory raised {exc}") from None
        except Exception as exc:
            raise SearchError(f"the float32 reference failed: {describe_error(exc)}") from exc
        if record.pruned:
            raise SearchError(
                f"the float32 reference itself went non-finite ({record.prune_reason}): "
                "fix the workload (learning rate, loss, data) before searching AMP configs; "
                "if your training clips gradients, return clip_norm from the factory"
            )
        add_reference(self.study, record, self.reference.to_dict())
        target = Target.from_reference(record.losses)
        self.log(f"float32 reference, seed {seed}: target loss {target.loss:.4g}, "
                 f"{record.median_step_time * 1e3:.3g} ms/step")

    def _exists(self, attrs: dict[str, Any], key: tuple[str, ...]) -> bool:
        """Whether the study has the run ``attrs`` describes: queued, running, done, or
        failed on its own error (a crash or Ctrl-C leaves no error, and is run again)."""
        return any(
            all(t.user_attrs.get(k) == attrs[k] for k in key)
            and (t.state in _LIVE or "error" in t.user_attrs)
            for t in self.study.get_trials(deepcopy=False)
        )

    def _ensure(self, attrs: dict[str, Any], key: tuple[str, ...]) -> None:
        """Queue the run ``attrs`` describes unless the study has it already."""
        if not self._exists(attrs, key):
            self.study.enqueue_trial({}, user_attrs=attrs)
            self._grow(1)

    # -- one trial --------------------------------------------------------------------------

    def _one_trial(self) -> None:
        self.study.optimize(self._objective, n_trials=1, catch=(_TrialFailed,))

    def _objective(self, trial: optuna.Trial) -> float:
        role = trial.user_attrs.get("role")
        if role is None and self._surplus(trial):
            trial.set_user_attr("role", "surplus")
            trial.set_user_attr("error", "not run: another worker took the study's last "
                                         "trial slot at the same moment")
            raise _TrialFailed()
        if role in (None, ROLE_SEARCH):
            config = self.space.suggest(trial)
            seed = self.seed
            attrs = {"role": ROLE_SEARCH, "config": config.to_dict(), "seed": seed}
        else:
            config = AmpConfig.from_dict(trial.user_attrs["config"])
            seed = int(trial.user_attrs["seed"])
            attrs = {}
        for key, value in {**attrs, "worker": WORKER}.items():
            trial.set_user_attr(key, value)
        target = self.target(seed)
        try:
            record = self._execute(config, seed, trial)
        except Exception as exc:  # TrialCrashed, or anything the user's code raised
            self._failed(trial, exc)
            raise _TrialFailed() from None
        self._any_success = True
        if record.prune_kind == "forward":
            self._locate_overflow(trial, config, seed, record)
        judged = judged_attrs(record, target)
        for key, value in judged.items():
            trial.set_user_attr(key, value)
        trial.storage.set_trial_system_attr(trial._trial_id, SCALES_ATTR,  # noqa: SLF001
                                            encode_scales(record.scales))
        trial.set_constraint("target_gap", min(target.gap(record.losses), 1e300))
        self._advance(trial, config, record, judged)
        if record.pruned:
            raise optuna.TrialPruned(record.prune_reason)
        return objective_value(record, judged)

    def _locate_overflow(self, trial: optuna.Trial, config: AmpConfig, seed: int,
                         record: RunRecord) -> None:
        """Name the module whose output first went non-finite (one watched forward pass)."""
        try:
            module = first_overflowing_module(self.factory, config, seed=seed, device=self.device)
        except Exception:  # the diagnosis is a courtesy; the prune reason stands without it
            return
        if module is not None:
            trial.set_user_attr("overflow_module", module)
            record.prune_reason = (f"{record.prune_reason}; the first module whose output is "
                                   f"non-finite is '{module}'")

    def _surplus(self, trial: optuna.Trial) -> bool:
        """Whether a freshly sampled trial is over the study's budget (a race between
        workers asking at the same moment; trials already counted are those numbered lower)."""
        earlier = [t for t in self.study.get_trials(deepcopy=False) if t.number < trial.number]
        return _counted_search_trials(earlier) >= self.n_trials

    def _execute(self, config: AmpConfig, seed: int, trial: optuna.Trial) -> RunRecord:
        if self.isolation is not None:
            record = run_isolated(self.spec, config, steps=self.steps, seed=seed,
                                  device=self.device, timeout_s=self.isolation.timeout_s,
                                  memory_gb=self.isolation.memory_gb)
            _report(trial, record, 0)
            return record
        return run_config(self.factory, config, steps=self.steps, seed=seed, device=self.device,
                          on_window=lambda record, start: _report(trial, record, start))

    def _failed(self, trial: optuna.Trial, exc: BaseException) -> None:
        cause = exc.__cause__ if isinstance(exc, FactoryError) and exc.__cause__ else exc
        if isinstance(cause, TrialCrashed):
            message, _, trace = str(cause).partition("\n")
        else:
            message = describe_error(cause)
            trace = "".join(traceback.format_exception(cause))
        trial.set_user_attr("error", message)
        trial.set_user_attr("traceback", trace[-4000:])
        self.log(f"#{trial.number} failed: {message}")
        self._failures.append(message)
        recent = self._failures[-_policy.SAME_FAILURES_BEFORE_STOP:]
        if (not self._any_success and len(recent) == _policy.SAME_FAILURES_BEFORE_STOP
                and len(set(recent)) == 1):
            raise SearchError(
                f"the first {len(recent)} runs all failed with the same error, so the workload "
                f"is broken rather than a config: {message}"
            )
        if self._bar is not None:
            self._bar.update(1)

    # -- progress ---------------------------------------------------------------------------

    def _advance(self, trial: optuna.Trial, config: AmpConfig, record: RunRecord,
                 judged: dict[str, Any]) -> None:
        attrs = trial.user_attrs
        who = {ROLE_BASELINE: attrs.get("baseline"),
               ROLE_CONFIRM: f"confirm #{attrs.get('confirms')} seed {record.seed}"}.get(
                   attrs.get("role"), "")
        steps, ratio = judged["steps_to_target"], judged["loss_vs_float32"]
        if record.pruned:
            what = f"pruned: {record.prune_reason}"
        elif steps is None:
            what = "never reached the target" + (
                f" (final loss {ratio:.3g}x float32)" if ratio is not None else "")
        else:
            what = f"reached the target at step {steps}"
        skipped = judged["skipped_steps"]
        self.log(f"#{trial.number} {who + ' ' if who else ''}[{config.describe()}] {what}"
                 + (f", {skipped} skipped" if skipped else ""))
        if self._bar is not None:
            self._bar.update(1)

    def _grow(self, n: int) -> None:
        if self._bar is not None:
            self._bar.total = (self._bar.total or 0) + n
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _counted_search_trials(trials: list[optuna.trial.FrozenTrial]) -> int:
    """Sampled trials that use up the budget: done, running or queued (not failed ones,
    whose retries count instead). A just-asked trial has no role yet; count it too."""
    return sum(
        1 for t in trials
        if t.state in _LIVE and (t.user_attrs.get("role") == ROLE_SEARCH
                                 or ("role" not in t.user_attrs and t.state == TrialState.RUNNING))
    )


def _report(trial: optuna.Trial, record: RunRecord, start: int) -> None:
    for step in range(start, record.steps_run):
        if math.isfinite(record.losses[step]):
            trial.report(record.losses[step], step)


def _bar() -> Any:
    from tqdm.auto import tqdm

    # A bar as wide as the terminal wraps in some (tmux), and the lines written above it
    # then start on the bar's row; 100 columns leaves room.
    return tqdm(total=0, desc="scalertune", unit="run", file=sys.stderr, leave=False, ncols=100)
