"""What a trial says it runs and how it ended, as typed records: one writer and one reader each.

A trial's user attributes hold these records (the judged figures are another,
:mod:`scalertune._judge._judged`):

- :class:`Job`: what the trial runs (its role, config, seed, and where it sits: the run it
  confirms, branches or keeps an island of). A queued trial is made with it
  (``study.enqueue_trial(params, user_attrs=job.attrs())``); a retry copies it and nothing
  else (:mod:`~scalertune._storage._recovery`);
- :class:`Marks`: what the search noted as the trial ended: who ran it, the error it raised,
  the evidence it could not get, the twin it reused, where its forward overflowed;
- :class:`Recommendation`: what the recommended trial (the answer) stores of its own.

The stored keys are the fields' names (:data:`JOB_ATTRS`, :data:`MARK_ATTRS`), and each
field's stored kind is read from its annotation, so a key is named once, in the field. A
study's storage is written by others too: each record's ``read`` checks every value's kind
(:class:`~scalertune._errors.DamagedEvidence` naming the first that is not what the search
writes); no other module names a trial's attribute (``tests/unit/test_records.py``), though
a retry copies the job's attributes (:data:`JOB_ATTRS`) as stored; :func:`role_of` reads
the role alone, where a question needs nothing else (which trials are runs, which is a
reference).

These records carry no version of their own: their format is the study's. A study a later
release wrote is refused by its settings' version (:class:`~scalertune.StudySettings`) before
any of its trials is judged; within a version, a key these readers do not know is left alone,
and a known key holding another kind of value is damaged evidence.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, TypeGuard, TypeVar

from optuna.trial import FrozenTrial, Trial

from scalertune._amp._config import AmpConfig
from scalertune._errors import DamagedEvidence, UsageError
from scalertune._storage._names import ROLE_PHASE
from scalertune._storage._store import plain

_R = TypeVar("_R", bound="_UserRecord")


class _UserRecord:
    """What the records stored as a trial's user attributes share: the writer (:meth:`attrs`,
    :meth:`write`) and the reader (:meth:`read`, :meth:`of_trial`), keyed by the fields'
    names, each value checked against its field's annotation."""

    def attrs(self) -> dict[str, Any]:
        """The user attributes that store it (the writer): its fields that are set."""
        return dict(_set_fields(self))

    def write(self, trial: Any) -> None:
        """Store the fields that are set on the running ``trial``."""
        for name, value in self.attrs().items():
            trial.set_user_attr(name, value)

    @classmethod
    def read(cls: type[_R], attrs: Mapping[str, Any], where: str = "a trial") -> _R:
        """The record stored in ``attrs`` (a trial's user attributes), its values checked: a
        value of another kind is :class:`DamagedEvidence`, naming ``where`` and the key."""
        return cls(**checked(cls, attrs, where))

    @classmethod
    def of_trial(cls: type[_R], trial: FrozenTrial | Trial) -> _R:
        """``trial``'s record (:meth:`read`)."""
        return cls.read(trial.user_attrs, f"trial #{trial.number}")


@dataclasses.dataclass(frozen=True)
class Job(_UserRecord):
    """What a trial runs: the user attributes a queued trial is made with (``None``: not
    stored). A trial the sampler chose stores ``role``, ``config`` and ``seed``."""

    #: What the run is for (``_names.ROLE_*``).
    role: str | None = None
    #: The baseline it is (``pytorch-default``, ...), for a baseline.
    baseline: str | None = None
    #: The candidate's trial number it reruns on another seed, for a confirmation.
    confirms: int | None = None
    seed: int | None = None
    config: AmpConfig | None = None
    #: The finalist a phase run judges, and its window of the horizon.
    of: int | None = None
    start: int | None = None
    end: int | None = None
    #: The finalist an island run keeps one module of in float32.
    island_of: int | None = None
    #: The AMP run whose clipping a float32 run takes.
    clip_of: int | None = None
    #: A checkpoint's file name: the state a run from step 0 saves, and the one its
    #: continuation starts from.
    save: str | None = None
    continues: str | None = None

    def attrs(self) -> dict[str, Any]:
        """The user attributes that store it (the writer): its fields that are set, its
        config as plain data."""
        return {
            name: value.to_dict() if isinstance(value, AmpConfig) else value
            for name, value in _set_fields(self)
        }

    def write(self, trial: Any) -> None:
        """Store the fields that are set on the running ``trial``, its role last: each is a
        write of its own, and a worker killed between them leaves a trial whose role, where
        it has one, comes with the whole job (a queued trial is made with all of it at once)."""
        attrs = self.attrs()
        role = attrs.pop("role", None)
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        if role is not None:
            trial.set_user_attr("role", role)

    @classmethod
    def read(cls, attrs: Mapping[str, Any], where: str = "a trial") -> Job:
        """The job stored in ``attrs``, its values checked (:meth:`_UserRecord.read`), its
        config an AMP config and its checkpoints' names plain file names."""
        values = checked(cls, attrs, where)
        config = attrs.get("config")
        if config is not None:
            try:
                values["config"] = AmpConfig.from_dict(config)
            except (UsageError, TypeError, ValueError, AttributeError) as exc:
                raise damaged(where, "config", f"is not an AMP config ({exc})") from None
        for key in ("save", "continues"):
            if values.get(key) is not None and not plain(values[key]):
                raise damaged(where, key, "is not a checkpoint's file name")
        return cls(**values)

    @classmethod
    def sound(cls, trial: FrozenTrial) -> Job | None:
        """``trial``'s job, or ``None`` where it is damaged (a pass over every trial that
        leaves damaged ones to the check)."""
        try:
            return cls.of_trial(trial)
        except DamagedEvidence:
            return None

    @classmethod
    def partial(cls, trial: FrozenTrial) -> Job:
        """``trial``'s job; where it is damaged, the fields that are sound, each read alone
        (a line that names a run still names it)."""
        try:
            return cls.of_trial(trial)
        except DamagedEvidence:
            pass
        sound = {}
        for name in JOB_ATTRS:
            try:
                value = cls.read({name: trial.user_attrs.get(name)})
            except DamagedEvidence:
                continue
            sound[name] = getattr(value, name)
        return cls(**sound)

    def same(self, other: Job, fields: tuple[str, ...]) -> bool:
        """Whether ``other`` is the same run as this by ``fields`` (a queued job's key)."""
        return all(getattr(self, f) == getattr(other, f) for f in fields)

    @property
    def from_start(self) -> bool:
        """A phase run trained from step 0, or its continuation (not a branch from float32's
        checkpoint)."""
        return self.role == ROLE_PHASE and (self.start == 0 or bool(self.continues))


@dataclasses.dataclass(frozen=True)
class Marks(_UserRecord):
    """What the search noted as a trial ended (``None``: not noted)."""

    #: ``host:pid`` of the worker running it: the first thing written to a trial it takes.
    worker: str | None = None
    #: The first line of the error a failed run raised (its traceback is a system attribute).
    error: str | None = None
    #: Why a run could not get its evidence (a fault, never the config's): queued again.
    missing: str | None = None
    #: The finished trial whose result a sampled config that had run already reuses.
    duplicate_of: int | None = None
    #: Where a forward overflowed (the culprit modules), and the float32 islands checked to
    #: make it finite, comma-separated.
    overflow_module: str | None = None
    overflow_islands: str | None = None

    @classmethod
    def sound(cls, trial: FrozenTrial) -> Marks:
        """``trial``'s marks, none where they are damaged (a pass over every trial that
        leaves damaged ones to the check)."""
        try:
            return cls.of_trial(trial)
        except DamagedEvidence:
            return cls()


@dataclasses.dataclass(frozen=True)
class Recommendation(_UserRecord):
    """What the recommended trial (the study's answer, role ``recommended``) stores of its
    own beside the job and figures of the run it repeats."""

    #: The run it repeats: a trial number, or ``"float32"`` for the float32 reference.
    recommends: int | str | None = None
    #: The float32 reference's trial, where it repeats that.
    reference_trial: int | None = None
    #: The summary's verdict, and the speedup against float32 it rests on.
    verdict: str | None = None
    speedup_vs_float32: float | None = None


@dataclasses.dataclass(frozen=True)
class Retry:
    """Where a trial sits in a chain of retries, as Optuna's retry callback keeps it (system
    attributes): the first failed attempt, and every attempt before this one."""

    failed_trial: int | None = None
    retry_history: tuple[int, ...] = ()

    def first(self, number: int) -> int:
        """The chain's first attempt (``number``, the trial's own, where it is the first)."""
        return number if self.failed_trial is None else self.failed_trial

    def attrs(self) -> dict[str, Any]:
        """The system attributes that store it (the writer): its fields that are set."""
        out: dict[str, Any] = {}
        if self.failed_trial is not None:
            out["failed_trial"] = self.failed_trial
        if self.retry_history:
            out["retry_history"] = list(self.retry_history)
        return out

    @classmethod
    def sound(cls, trial: FrozenTrial) -> Retry:
        """``trial``'s place in its chain (the reader); none where it is damaged: the
        attempt then counts as a chain of its own."""
        system = trial.system_attrs
        first, history = system.get("failed_trial"), system.get("retry_history", [])
        if not (first is None or is_integer(first)) or not (
            isinstance(history, list) and all(is_integer(n) for n in history)
        ):
            return cls()
        return cls(failed_trial=first, retry_history=tuple(history))


#: The user attributes each record stores, by its fields' names.
JOB_ATTRS = tuple(f.name for f in dataclasses.fields(Job))
MARK_ATTRS = tuple(f.name for f in dataclasses.fields(Marks))
#: The system attributes :class:`Retry` stores (Optuna's names).
RETRY_ATTRS = tuple(f.name for f in dataclasses.fields(Retry))

#: The fields of a :class:`Job` that name each kind of queued run (:meth:`Job.same`): the
#: study holds one of each.
BASELINE_KEY = ("role", "baseline")
CONFIRM_KEY = ("role", "confirms", "seed")
CLIP_KEY = ("role", "clip_of", "seed")
REPLAY_KEY = ("role",)
#: ... a phase run (a branch, a run from step 0, a continuation), and an island.
PHASE_KEY = ("role", "of", "start")
ISLAND_KEY = ("role", "island_of")


def role_of(trial: FrozenTrial | Trial) -> str | None:
    """``trial``'s role alone (``None`` where it stores none, or stores one that is not
    text): the question of every pass over a study's trials, at no parse of the rest."""
    role = trial.user_attrs.get("role")
    return role if isinstance(role, str) else None


def damaged(where: str, key: str, why: str) -> DamagedEvidence:
    """The one line naming a damaged stored value."""
    return DamagedEvidence(f"{where}'s {key} is damaged: it {why}")


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_integer(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 2**62


#: A field's annotation -> the check of a stored value of it, and what a value failing it is
#: not. A record's other fields (a config, a list) are checked by the record's own reader.
_KINDS: dict[str, tuple[Any, str]] = {
    "int | None": (is_integer, "is not a whole number"),
    # NaN is never written (a figure that is not finite is stored as null): it is damage
    "float | None": (lambda v: is_number(v) and v == v, "is not a number"),
    "str | None": (lambda v: isinstance(v, str), "is not text"),
    "bool | None": (lambda v: isinstance(v, bool), "is not true or false"),
    "int | str | None": (
        lambda v: is_integer(v) or isinstance(v, str),
        "is not a trial number or a name",
    ),
}


@functools.cache
def kinds(record: type) -> tuple[tuple[str, Any, str], ...]:
    """``record``'s fields whose stored kind its annotation names: (name, check, why)."""
    return tuple(
        (f.name, *_KINDS[str(f.type)]) for f in dataclasses.fields(record) if str(f.type) in _KINDS
    )


def checked(
    record: type, stored: Mapping[str, Any], where: str, prefix: str = ""
) -> dict[str, Any]:
    """``record``'s fields of a kind its annotation names, as ``stored`` holds them (under
    ``prefix`` and the field's name), each checked: absent and ``None`` are unset, a value of
    another kind is :class:`DamagedEvidence` naming ``where`` and the key."""
    out = {}
    for name, check, why in kinds(record):
        value = stored.get(prefix + name)
        if value is not None:
            if not check(value):
                raise damaged(where, prefix + name, why)
            out[name] = value
    return out


def _set_fields(record: Any) -> list[tuple[str, Any]]:
    return [
        (f.name, getattr(record, f.name))
        for f in dataclasses.fields(record)
        if getattr(record, f.name) is not None
    ]
