"""The Optuna study a search lives in: its settings, the float32 references and the trials.

One study holds everything a search ran, so that resuming, a second worker or a later
``report`` see the same evidence:

- a study user attribute with the settings the study was created with
  (:class:`~scalertune._judge._settings.StudySettings`: factory, steps, horizon, seed, space,
  device, the reference's clipping): a rerun with other settings is refused;
- one *reference* trial per seed the search needed: the float32 run, its target loss, and
  (for the main seed) the interleaved step time of every dtype the study may run;
- the sampled *search* trials, the two named *baseline* trials, the *confirmation* reruns and
  one *recommended* trial, each with its config, its curve and its judged attributes.

Every run has the ``dtype`` parameter (float32 for the references), so the dashboard's
tables and plots show every run as a point of the same space; the space's sampler proposes
only the space's own dtypes (:meth:`SearchSpace.sampler`). The objective is the time to
target in seconds, ``inf`` for runs that never reach it and for the references (the yardstick,
not a candidate). The dashboard's Best Trial is the study's recommended trial (a repeat of the
answer's run, float32's included), not the least value: see :mod:`scalertune._review._server`.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
import time
import warnings
from typing import Any

import optuna
from optuna.trial import TrialState

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._amp._fingerprint import model_size
from scalertune._errors import UsageError
from scalertune._judge._judged import Figures, Judged
from scalertune._judge._outcome import encode_scales
from scalertune._judge._reference import Reference
from scalertune._judge._settings import StudySettings
from scalertune._judge._target import Target, smoothed
from scalertune._run._record import RunRecord
from scalertune._run._step_times import StepTimes
from scalertune._search import _policy as _search_policy
from scalertune._search._space import SearchSpace
from scalertune._storage._names import (
    CONSTRAINT_ATTR,
    CONSTRAINTS_ATTR,
    LOSSES_ATTR,
    ROLE_REFERENCE,
    SCALES_ATTR,
    SETTINGS_ATTR,
)
from scalertune._storage._open import first_line
from scalertune._storage._optuna import set_system_attr, study_id
from scalertune._storage._redact import redact
from scalertune._storage._trial_record import Job, Marks, Retry
from scalertune._text import plural

_SETTINGS_WAIT_S = 30


def open_study(
    storage: Any,
    study_name: str,
    settings: StudySettings,
    *,
    seed: int,
    url: str,
    space: SearchSpace,
) -> tuple[optuna.Study, bool]:
    """Create the study, or load it when it exists with the same settings.

    Returns the study and whether this call created it."""
    sampler = space.sampler(seed=seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study = optuna.create_study(
                storage=storage,
                study_name=study_name,
                direction="minimize",
                sampler=sampler,
                load_if_exists=True,
            )
    except Exception as exc:
        raise UsageError(
            f"cannot open study {study_name!r} in {redact(url)}: {redact(first_line(exc), url)}"
        ) from None
    stored = study.user_attrs.get(SETTINGS_ATTR)
    if stored is None and study.trials:
        # Another worker created the study a moment ago and is writing its settings.
        deadline = time.monotonic() + _SETTINGS_WAIT_S
        while stored is None and time.monotonic() < deadline:
            time.sleep(0.2)
            stored = optuna.load_study(study_name=study_name, storage=storage).user_attrs.get(
                SETTINGS_ATTR
            )
    if stored is None:
        # the study's own name for its files (its float32 checkpoints): a study made again
        # under the same name, in a new database or after a delete, gets another
        created = dataclasses.replace(settings, instance=secrets.token_hex(4))
        study.set_user_attr(SETTINGS_ATTR, created.to_dict())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["time to target (s)"])
        return study, True
    existing = StudySettings.from_dict(stored)
    key = existing.differs_from(settings)
    if key == "model":
        raise UsageError(
            f"study {study_name!r} was searched on another model "
            f"({model_size(existing.model or {})}; this one has "
            f"{model_size(settings.model or {})}, named or shaped otherwise): pass a new "
            "--study-name to search this one"
        )
    if key in ("nproc_per_node", "nnodes"):
        raise UsageError(
            f"study {study_name!r} was searched on {_world(existing)}, and this search runs "
            f"on {_world(settings)}: its evidence is that world's runs; run it on as many hosts "
            "and ranks per host, or pass a new --study-name"
        )
    if key is not None:
        raise UsageError(
            f"study {study_name!r} was created with {key}={_short(existing.to_dict()[key])}, "
            f"not {_short(settings.to_dict()[key])}: rerun with the same {key}, or pass a new "
            "--study-name"
        )
    return study, False


def instance(study: optuna.Study) -> str:
    """What tells this study from another of the same name: the token its settings got when
    it was created (the storage's study id for a study made before there was one, which a
    new database, or a name deleted and used again, gives out again). Workers that create
    the study at the same moment each write one and the last write stays; it is first read
    inside the float32 reference's claim (:mod:`scalertune._storage._claims`), which settles
    after those writes, so every worker reads the same."""
    return StudySettings.of(study).instance or str(study_id(study))


def _world(settings: StudySettings) -> str:
    """The ranks every run trains on, in words: ``2 ranks per run (2 hosts x 1)``,
    ``2 ranks per run (1 host x 2)``."""
    ranks = settings.nproc_per_node * settings.nnodes
    hosts = f" ({plural(settings.nnodes, 'host')} x {settings.nproc_per_node})" if ranks > 1 else ""
    return f"{ranks} rank{'s' if ranks > 1 else ''} per run{hosts}"


def _short(value: Any) -> str:
    if isinstance(value, dict) and "name" in value:
        return repr(value["name"])
    return repr(value)


def add_reference(
    study: optuna.Study,
    record: RunRecord,
    config: AmpConfig,
    times: StepTimes | None,
    *,
    settings: StudySettings,
    checkpoints: dict[int, str],
) -> None:
    """Store a finished float32 run as the reference trial of its seed, in one write.

    Its first ``steps`` losses define the target of the trials; a reference to a longer
    horizon also stores its losses over each phase window (float32's own continuation,
    which a branch from the window's checkpoint is compared with) and where those
    checkpoints are. Its gradient trace goes with it."""
    early = record.losses[: settings.steps]
    target = Target.from_reference(early)
    reference = Reference(
        seed=record.seed,
        losses=tuple(early),
        target_loss=target.loss,
        steps_to_target=target.steps_to_target(early),
        step_time_s=times.median("float32") if times else record.median_step_time,
        steps_run=record.steps_run,
        step_times=times,
        horizon=len(record.losses) if checkpoints else None,
        windows={start: tuple(record.losses[start:end]) for start, end in settings.windows}
        if checkpoints
        else {},
        checkpoints=dict(checkpoints),
        trace=record.trace,
    )
    user_attrs, system_attrs = reference.to_attrs()
    first = _failed_attempts(study, record.seed)
    if first is not None:  # the run again of an attempt that failed (add_failed_reference)
        system_attrs.update(Retry(failed_trial=first).attrs())
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.COMPLETE,
            value=math.inf,
            params={"dtype": "float32"},
            distributions={"dtype": settings.dtype_distribution},
            intermediate_values=relative_curve(record.losses, target),
            user_attrs={
                **Job(role=ROLE_REFERENCE, seed=record.seed, config=config).attrs(),
                **user_attrs,
            },
            system_attrs={**system_attrs, **_constraints(0.0)},
        )
    )


def add_failed_reference(
    study: optuna.Study, seed: int, config: AmpConfig, why: str, *, settings: StudySettings
) -> None:
    """Record a float32 reference run that failed for a fault of one process (a rank that
    died or hung) as a failed trial of its seed, saying why as missing evidence (never as an
    error of the workload): it is run again, and the study keeps that it happened. Each
    attempt names the first (``failed_trial``, as a queued retry does), and so does the
    reference that finally ran (:func:`add_reference`): the evidence is missing only while
    no attempt of the chain has finished."""
    first = _failed_attempts(study, seed)
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.FAIL,
            params={"dtype": "float32"},
            distributions={"dtype": settings.dtype_distribution},
            user_attrs={
                **Job(role=ROLE_REFERENCE, seed=seed, config=config).attrs(),
                **Marks(missing=why[:2000]).attrs(),
            },
            system_attrs=Retry(failed_trial=first).attrs(),
        )
    )


def _failed_attempts(study: optuna.Study, seed: int) -> int | None:
    """The first failed attempt at the float32 reference of ``seed`` (its claim's holder
    alone adds them), if any."""
    numbers = [
        Retry.sound(t).first(t.number)
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        if (job := Job.sound(t)) is not None and job.role == ROLE_REFERENCE and job.seed == seed
    ]
    return min(numbers, default=None)


def relative_curve(losses: list[float], target: Target, start: int = 0) -> dict[int, float]:
    """Step -> log10 of the smoothed loss over the target, at the end of each read-back
    window (0 is the target): what the dashboard plots, on one axis for every run whatever
    its loss scale. ``start`` is the run's first step (a branch's); a long run is thinned to
    about ``CURVE_POINTS`` points."""
    curve = smoothed(losses)
    every = _policy.READBACK_INTERVAL * max(
        1, len(curve) // (_search_policy.CURVE_POINTS * _policy.READBACK_INTERVAL)
    )
    points = {}
    for end in range(every, len(curve) + every, every):
        step = min(end, len(curve)) - 1
        value = target.relative(curve[step])
        if math.isfinite(value):
            points[start + step] = value
    return points


def _constraints(gap: float) -> dict[str, Any]:
    """Optuna's constraint, in both the per-key form Optuna 5 writes (``set_constraint``)
    and the list optuna-dashboard 0.21 reads to mark infeasible trials."""
    gap = min(gap, 1e300)
    return {CONSTRAINT_ATTR: gap, CONSTRAINTS_ATTR: [gap]}


def store_constraint(trial: optuna.Trial, gap: float) -> None:
    """Mark the running ``trial`` feasible (``gap`` <= 0: it reached the target) or not."""
    for key, value in _constraints(gap).items():
        set_system_attr(trial, key, value)


def judged_of(record: RunRecord, target: Target, step_time: float | None) -> Judged:
    """What a run's record shows against the target: the figures a user reads in the summary
    and the dashboard, and why it was pruned."""
    reached = (
        None if record.pruned else (record.reached_at or target.steps_to_target(record.losses))
    )
    ratio, at = target.ratio_at(record.losses)
    figures = Figures(
        skipped_steps=len(record.skipped),
        final_scale=record.scales[-1] if record.scales else None,
        min_scale=min(record.scales) if record.scales else None,
        first_nonfinite_step=record.first_nonfinite_step,
        steps_run=record.steps_run,
        steps_to_target=reached,
        step_time_s=step_time,
        time_to_target_s=None if reached is None or step_time is None else reached * step_time,
        loss_vs_float32=_finite_or_none(ratio),
        loss_vs_float32_step=at,
    )
    return Judged(
        figures=figures,
        measured_step_time_s=_finite_or_none(record.median_step_time),
        pruned_because=record.prune_kind if record.pruned else None,
        prune_reason=record.prune_reason if record.pruned else None,
    )


def store_curves(trial: optuna.Trial, record: RunRecord) -> None:
    """The per-step loss and loss scale, for the pictures and for ``report``."""
    set_system_attr(trial, LOSSES_ATTR, record.losses)
    set_system_attr(trial, SCALES_ATTR, encode_scales(record.scales))


def objective_value(judged: Judged) -> float:
    """What Optuna minimises: time to target, ``inf`` when never reached."""
    value = judged.figures.time_to_target_s
    return math.inf if value is None else float(value)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
