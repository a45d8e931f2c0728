"""search(): the whole pipeline, from a factory spec to a confirmed recommendation.

load the workload -> validate (one float32 step) -> open the study -> float32 reference and
step timing -> sampled trials -> baselines -> rank -> confirm the best on other seeds ->
recommended trial -> result.

Any number of workers may run the same search on one storage. The once-per-study work (the
references, the baselines, each confirmation, the recommended trial) is coordinated with
claims (:mod:`scalertune._storage._claims`); every run is an Optuna trial
(:mod:`scalertune._search._trials`).
Everything the command line does goes through here.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState

from scalertune import _interrupt, _policy
from scalertune._amp._config import BASELINES
from scalertune._amp._float8 import Float8LeftOut
from scalertune._errors import StorageUnavailable, UsageError
from scalertune._judge._settings import StudySettings
from scalertune._review._analyze import analyze
from scalertune._review._result import SearchResult
from scalertune._search._options import Isolation, SearchOptions
from scalertune._search._pipeline import Pipeline
from scalertune._search._progress import Progress
from scalertune._search._setup import Setup, prepare
from scalertune._search._space import SearchSpace
from scalertune._search._study import open_study
from scalertune._storage._claims import held
from scalertune._storage._names import ROLE_RECOMMENDED
from scalertune._storage._open import DEFAULT_STORAGE, open_storage, storage_url
from scalertune._storage._optuna import storage_of
from scalertune._storage._outage import Outage, forget, set_log
from scalertune._storage._recovery import missing_of, retry
from scalertune._storage._redact import redact
from scalertune._storage._store import Store, default_location, settle_location
from scalertune._storage._trial_record import role_of
from scalertune._text import plural
from scalertune._workload._loader import default_study_name

__all__ = ["cost_estimate", "run_search", "search"]


def search(
    factory: str | Callable[[], Any],
    *,
    storage: str | None = None,
    study_name: str | None = None,
    space: str | SearchSpace = "default",
    fp32_modules: str | None = None,
    n_trials: int = 24,
    steps: int = _policy.SEARCH_STEPS,
    horizon: int | None = None,
    seed: int = 0,
    device: str | None = "auto",
    timeout: float | None = None,
    isolation: Isolation | None = None,
    artifact_dir: str | None = None,
    nproc_per_node: int | None = None,
    wait_for_storage: float = 0.0,
    log: Callable[[str], None] | None = None,
    progress: bool = False,
) -> SearchResult:
    """Search AMP configs for the workload ``factory`` returns; return the evidence.

    The pipeline: one float32 step to check the workload, the study opened (or resumed), the
    float32 reference and the step timing, ``n_trials`` sampled configs, PyTorch's defaults
    as baselines, the ranking, the best configs confirmed on other seeds, then the answer.
    Any number of workers may run the same search on one storage; rerunning resumes it.

    Args:
        factory: ``path/to/model.py:make_model``, ``package.module:make_model`` or the
            function itself; it returns a :class:`Workload`, a mapping of its fields, or a
            trainer (Hugging Face, Lightning, Accelerate).
        storage: An Optuna storage URL, a SQLite file or a journal file; ``None`` for
            ``sqlite:///scalertune.db`` here.
        study_name: The study's name; ``None`` for the factory's module and name
            (``examples/classifier.py:make_model`` is ``classifier:make_model``).
        space: A search space: ``"default"``, ``"float16"``, ``"bfloat16"``, the path of a
            space YAML, or a :class:`SearchSpace`.
        fp32_modules: Modules kept in float32 on every float16 trial (comma-separated names or
            glob patterns); ``None`` for none.
        n_trials: How many sampled trials the study runs at most, across reruns and workers.
        steps: How many steps each trial trains.
        horizon: How many steps your training runs; ``None`` for the factory's, else
            ``steps``. The float32 reference trains that far once and the finalists are
            branched at its late phases.
        seed: The seed of every run (the confirmations use others).
        device: ``"auto"`` (CUDA when this machine has it), ``"cuda"``, ``"cuda:1"`` or
            ``"cpu"``.
        timeout: Seconds after which no more trials are sampled; ``None`` for no limit.
        isolation: Run each trial in its own process, bounded (:class:`Isolation`); ``None``
            runs them in this one.
        artifact_dir: The study's artifact store, its float32 checkpoints and pictures: a
            folder or ``s3://BUCKET``; ``None`` for ``scalertune-artifacts`` beside a SQLite
            or journal file, else here. Recorded in the study, where every worker finds it.
        nproc_per_node: More than 1 runs every run as that many ranks of one
            ``torch.distributed`` group, each in its own process (as torchrun runs a script):
            the factory, called in every rank, wraps its model (DDP, FSDP) itself. ``None``
            for the factory's own ``nproc_per_node`` attribute, else 1.
        wait_for_storage: Seconds to wait for a storage server that is not up as the
            search starts (the connection refused, the host unknown): a database restarting,
            or one started beside the workers. ``0`` says so at once (a wrong host or port is
            likelier); a storage that goes down once open is always ridden out.
        log: Called with each progress line; ``None`` for none.
        progress: A progress bar on stderr, with the lines above it (in place of ``log``)
            and the search's most cost said up front.

    Returns:
        The :class:`SearchResult`: the config to train with and its evidence.

    Raises:
        UsageError: Bad input (a missing factory, a factory that returns the wrong thing, an
            invalid space), before any study row is written; a number out of range is its
            subclass ``ParameterError``, a ``ValueError`` that names the parameter. Also a
            float32 reference that does not learn in ``steps`` (raise them or the learning
            rate). The command line prints the line and exits with status 2.
        SearchError: The workload itself fails, not one config: the float32 reference
            fails or goes non-finite, the step timing fails, or the first runs all fail
            with the same error.
        StorageUnavailable: The storage or the artifact store stayed unreachable past the
            outage bound, or the storage was not up after ``wait_for_storage``; nothing is
            lost: rerun, and the study resumes (the command line exits with status 3).

    Example:
        >>> import scalertune
        >>> result = scalertune.search("examples/classifier.py:make_model",
        ...                            storage="sqlite:///doc.db", n_trials=4,
        ...                            steps=60)  # doctest: +SKIP
        >>> result.config.dtype, result.best_amp.config.dtype  # doctest: +SKIP
        ('float32', 'bfloat16')
    """
    return run_search(
        factory,
        SearchOptions(
            storage=storage,
            study_name=study_name,
            space=space,
            fp32_modules=fp32_modules,
            n_trials=n_trials,
            steps=steps,
            horizon=horizon,
            seed=seed,
            device=device,
            timeout=timeout,
            isolation=isolation,
            artifact_dir=artifact_dir,
            nproc_per_node=nproc_per_node,
            wait_for_storage=wait_for_storage,
            log=log,
            progress=progress,
        ),
    )


def run_search(factory: str | Callable[[], Any], options: SearchOptions) -> SearchResult:
    """:func:`search`, its options in one record (checked as it was built): what the command
    line calls, with the record it builds from its flags."""
    setup = prepare(factory, options)
    url = storage_url(options.storage or DEFAULT_STORAGE)
    forget()
    try:
        return _search(factory, setup, url, options)
    except Outage as exc:
        raise StorageUnavailable(str(exc)) from None
    finally:
        set_log(None)


def _search(
    factory: str | Callable[[], Any], setup: Setup, url: str, options: SearchOptions
) -> SearchResult:
    if setup.artifact_dir is not None:
        Store(setup.artifact_dir).check()
    # From the first storage write on, Ctrl-C and SIGTERM stop the search at a safe point.
    with _interrupt.handled(), _interrupt.deferred():
        lines = Progress(options.log, bar=options.progress)
        set_log(lines.line)  # a wait for the storage is said as it starts
        study, created = open_study(
            open_storage(url, on_stale_trial=retry, wait_s=options.wait_for_storage),
            options.study_name or default_study_name(factory),
            setup.settings,
            seed=options.seed,
            url=url,
            space=setup.space,
        )
        try:
            settle_location(study, given=setup.artifact_dir, default=default_location(url))
        except UsageError:
            if created:  # refused before anything ran: no empty study is left behind
                optuna.delete_study(study_name=study.study_name, storage=storage_of(study))
            raise
        if not created:
            lines.line(resuming(study))
        for note in setup.notes:
            lines.line(note)
        if options.progress:
            lines.line(cost_estimate(setup))
        try:
            with warnings.catch_warnings():  # said above, once, not by every run
                warnings.simplefilter("ignore", Float8LeftOut)
                Pipeline(study, setup, lines, timeout=options.timeout).run()
            _interrupt.checkpoint()
        except KeyboardInterrupt:
            pass
        finally:
            lines.close()
        result = analyze(study, storage=redact(url))
        interrupted = _interrupt.received()
    return dataclasses.replace(result, interrupted=True) if interrupted else result


def cost_estimate(setup: Setup) -> str:
    """What a search will cost at most, in run-equivalents of its horizon, said up front."""
    steps, horizon, n_trials = setup.steps, setup.horizon, setup.n_trials
    dtypes = len(setup.space.timed_dtypes)
    timing = dtypes * (
        _policy.TIMING_WARMUP_STEPS + _policy.TIMING_ROUNDS * _policy.READBACK_INTERVAL
    )
    confirmations = len(_policy.CONFIRM_SEEDS) * _policy.CONFIRM_TOP
    short = (len(_policy.CONFIRM_SEEDS) + len(BASELINES) + n_trials + confirmations) * steps
    windows = setup.windows
    branches = (_policy.PHASE_FINALISTS - 1) * sum(end - start for start, end in windows)
    leader = horizon if windows else 0
    most = (horizon + timing + short + leader + branches) / horizon
    return (
        f"search cost: at most {most:.0f} run-equivalents of the horizon ({horizon} steps: "
        f"the float32 reference to the horizon, up to {n_trials} sampled trials of "
        f"{steps} steps, {len(BASELINES)} baselines, up to {confirmations} confirmations"
        + (
            ", the leading config from step 0 to the horizon and, if it does not hold, "
            "the other finalists' branches in the late phases"
            if windows
            else ""
        )
        + "); runs stop at the target or as soon as they cannot win, and sampling stops "
        "when it stops finding faster configs, so most searches cost a fraction of that"
    )


def resuming(study: optuna.Study) -> str:
    """What a rerun of a search finds: how far the study got, and that it goes on from there."""
    finished = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
    ]
    roles: dict[str, int] = {}
    for t in finished:
        role = role_of(t) or "?"
        roles[role] = roles.get(role, 0) + 1
    said = ", ".join(f"{n} {role}" for role, n in sorted(roles.items()))
    if not finished:
        seed = StudySettings.of(study).seed
        if held(study, f"reference.{seed}"):
            return (
                f"joining study {study.study_name!r}: another worker is running its "
                "float32 reference; this one waits for it, then shares the trials"
            )
        return f"resuming study {study.study_name!r}: no run finished yet; starting it"
    missing = missing_of(study.get_trials(deepcopy=False))
    done = ROLE_RECOMMENDED in roles
    return (
        f"resuming study {study.study_name!r}: {plural(len(finished), 'run')} finished "
        f"({said}); "
        + (
            f"the evidence of {plural(len(missing), 'run')} is missing: completing it"
            if missing
            else "the answer is in: checking for more work"
            if done
            else "going on from there"
        )
    )
