"""search(): the whole pipeline, from a factory spec to a confirmed recommendation.

load the workload -> validate (one float32 step) -> open the study -> float32 reference ->
baselines -> sampled trials -> rank -> confirm the best on other seeds -> result.
Everything the command line does goes through here.
"""

from __future__ import annotations

import dataclasses
import math
import platform
import sys
import traceback
from typing import Any, Callable

import optuna
import torch
from optuna.trial import TrialState

from scalertune import _policy
from scalertune._config import BASELINES, AmpConfig
from scalertune._errors import UsageError
from scalertune._judge import Target
from scalertune._rank import (ROLE_BASELINE, ROLE_CONFIRM, ROLE_SEARCH, SCALES_ATTR,
                              encode_scales, outcomes_of)
from scalertune._result import SearchResult, analyze
from scalertune._run import RunRecord, preflight, run_config
from scalertune._runtime import resolve_device
from scalertune._space import SearchSpace
from scalertune._study import (DEFAULT_STORAGE, default_study_name, judged_attrs,
                               objective_value, open_study, redact, store_reference,
                               stored_reference)
from scalertune._workload import FactoryError, load_factory, one_line


class SearchError(Exception):
    """The search cannot go on: the workload itself is broken (not one config)."""


def search(
    factory: str,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    space: str | SearchSpace = "default",
    n_trials: int = 24,
    steps: int = 200,
    seed: int = 0,
    device: str | None = "auto",
    log: Callable[[str], None] | None = None,
    progress: bool = False,
) -> SearchResult:
    """Search AMP configs for the workload ``factory`` returns; return the evidence.

    ``factory`` is ``path/to/model.py:make_model`` or ``package.module:make_model``.
    ``n_trials`` is the study's total of sampled trials: running the same search again
    resumes it up to that total. The float32 reference and the two baselines (PyTorch's
    defaults, and the same with ``init_scale=4096``) run once per study.

    Raises :class:`UsageError` for bad input before any study row is written.

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
    dev = resolve_device(device)
    user_factory = load_factory(factory)
    try:
        reference_config = preflight(user_factory, device=dev, seed=seed)
    except FactoryError as exc:
        raise UsageError(f"the factory {factory} raised {exc}: fix it and rerun") from None
    storage = storage or DEFAULT_STORAGE
    study_name = study_name or default_study_name(factory)
    settings = {
        "factory": factory, "steps": steps, "seed": seed, "space": space.to_dict(),
        "device_type": dev.type, "device": describe_device(dev),
        "reference": reference_config.to_dict(),
    }
    study = open_study(storage, study_name, settings, seed=seed)
    runner = _Runner(study, user_factory, reference_config, dev, steps, seed,
                     log or (lambda _: None), progress)
    try:
        runner.run(space, n_trials)
    except KeyboardInterrupt:
        runner.close()
        result = analyze(study, storage=redact(storage))
        return dataclasses.replace(result, interrupted=True)
    runner.close()
    return analyze(study, storage=redact(storage))


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"{device.type} ({platform.machine()}, {torch.get_num_threads()} threads)"


class _Runner:
    """Runs and stores the reference, the baselines, the trials and the confirmations."""

    def __init__(self, study: optuna.Study, factory: Callable[[], Any], reference: AmpConfig,
                 device: torch.device, steps: int, seed: int, log: Callable[[str], None],
                 progress: bool) -> None:
        self.study, self.factory, self.reference, self.device = study, factory, reference, device
        self.steps, self.seed = steps, seed
        self._bar = _bar() if progress else None
        # While a bar is drawn, lines must go through it or they tear it apart.
        self.log = (lambda line: self._bar.write(line, file=sys.stderr)) if self._bar else log
        self._failures: list[str] = []
        self._any_success = False

    def run(self, space: SearchSpace, n_trials: int) -> None:
        target = self.target(self.seed)
        outcomes = outcomes_of(self.study.get_trials(deepcopy=False))
        done_baselines = {o.attrs.get("baseline") for o in outcomes if o.role == ROLE_BASELINE}
        done_search = sum(o.role == ROLE_SEARCH for o in outcomes)
        todo = [n for n in BASELINES if n not in done_baselines]
        self._grow(len(todo) + max(0, n_trials - done_search))
        for name in todo:
            self.trial(BASELINES[name], ROLE_BASELINE, self.seed, target, {"baseline": name})
        for _ in range(max(0, n_trials - done_search)):
            trial = self.study.ask()
            self.trial(space.suggest(trial), ROLE_SEARCH, self.seed, target, {}, trial=trial)
        self.confirm()

    def confirm(self) -> None:
        """Rerun the best distinct candidates on the confirmation seeds (once each)."""
        result = analyze(self.study)
        todo = [(c, s) for c in result.candidates for s in _policy.CONFIRM_SEEDS
                if s not in result.confirmations.get(c.number, {})]
        self._grow(len(todo))
        for candidate, seed in todo:
            self.trial(candidate.config, ROLE_CONFIRM, seed, self.target(seed),
                       {"confirms": candidate.number})

    def target(self, seed: int) -> Target:
        """The float32 target of ``seed``; runs and stores the reference the first time."""
        reference = stored_reference(self.study, seed)
        if reference is None:
            self.log(f"float32 reference, seed {seed} ...")
            try:
                record = run_config(self.factory, self.reference, steps=self.steps, seed=seed,
                                    device=self.device)
            except FactoryError as exc:
                raise SearchError(f"the float32 reference failed: the factory raised {exc}") from None
            except Exception as exc:
                raise SearchError(f"the float32 reference failed: {one_line(exc)}") from exc
            if record.pruned:
                raise SearchError(
                    f"the float32 reference itself went non-finite ({record.prune_reason}): "
                    "fix the workload (learning rate, loss, data) before searching AMP configs; "
                    "if your training clips gradients, return clip_norm from the factory"
                )
            reference = store_reference(self.study, record)
            self.log(f"float32 reference, seed {seed}: target loss {reference['target_loss']:.4g}, "
                     f"{reference['median_step_time_s'] * 1e3:.3g} ms/step")
        return Target.from_reference(reference["losses"])

    def trial(self, config: AmpConfig, role: str, seed: int, target: Target,
              extra: dict[str, Any], trial: optuna.Trial | None = None) -> None:
        trial = trial or self.study.ask()
        for key, value in {"role": role, "config": config.to_dict(), "seed": seed, **extra}.items():
            trial.set_user_attr(key, value)

        def report(record: RunRecord, start: int) -> None:
            for step in range(start, record.steps_run):
                if math.isfinite(record.losses[step]):
                    trial.report(record.losses[step], step)

        try:
            record = run_config(self.factory, config, steps=self.steps, seed=seed,
                                device=self.device, on_window=report)
        except KeyboardInterrupt:
            trial.set_user_attr("error", "interrupted (Ctrl-C)")
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        except Exception as exc:  # user code failed under this config: the trial fails
            self._failed(trial, exc)
            return
        self._any_success = True
        for key, value in judged_attrs(record, target).items():
            trial.set_user_attr(key, value)
        trial.storage.set_trial_system_attr(trial._trial_id, SCALES_ATTR,  # noqa: SLF001
                                            encode_scales(record.scales))
        trial.set_constraint("target_gap", min(target.gap(record.losses), 1e300))
        if record.pruned:
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, objective_value(record, target))
        self._advance(trial.number, role, config, record, target, extra)

    def _failed(self, trial: optuna.Trial, exc: Exception) -> None:
        cause = exc.__cause__ if isinstance(exc, FactoryError) and exc.__cause__ else exc
        message = one_line(cause)
        trial.set_user_attr("error", message)
        trial.set_user_attr("traceback", "".join(traceback.format_exception(cause))[-4000:])
        self.study.tell(trial, state=TrialState.FAIL)
        self.log(f"trial #{trial.number} failed: {message}")
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

    def _advance(self, number: int, role: str, config: AmpConfig, record: RunRecord,
                 target: Target, extra: dict[str, Any]) -> None:
        who = {ROLE_BASELINE: extra.get("baseline"),
               ROLE_CONFIRM: f"confirm #{extra.get('confirms')} seed {record.seed}"}.get(role, "")
        steps = target.steps_to_target(record.losses)
        if record.pruned:
            what = f"pruned: {record.prune_reason}"
        elif steps is None:
            what = f"never reached the target (final loss {target.final_ratio(record.losses):.3g}x float32)"
        else:
            what = f"reached the target at step {steps}"
        skipped = len(record.skipped)
        self.log(f"#{number} {who + ' ' if who else ''}[{config.describe()}] {what}"
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


def _bar() -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=0, desc="scalertune", unit="run", file=sys.stderr, leave=False)

