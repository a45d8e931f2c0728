"""A real run's record, as one typed record: made by the in-run check as the run trains (what
``amp.report()`` prints), sent by the run's log to the study its result file came from, and
read back by ``scalertune report`` and the dashboard's study note.

The check (:meth:`InRunCheck.summary <scalertune._inrun._checker.InRunCheck.summary>`) makes
it after each check and action: the policy, the config the run trains with now, every check
kept, every action, and the scaler's story beside the search's prediction. The log
(:class:`~scalertune._storage._run_log.RunLog`) adds who ran it (the host, the start, the
result file, the device) and stores it as one study user attribute per run
(:data:`~scalertune._storage._names.RUN_PREFIX`), as plain data: :meth:`RunRecord.to_dict`
writes it, with its ``version``, and :meth:`RunRecord.from_dict` reads every version a study
may hold. Each field says how it is written and read, so the stored keys are the fields'
names, spelled nowhere else.

What a study holds is data, never trusted, and never code: a value that is no run's record
at all (not a mapping; no policy, config or count of steps; checks or actions that are not
lists) is :class:`NotARunRecord`, and left out of the report; a record whose parts are not
what a run writes (of another type, out of bounds, of a newer version) is
:class:`~scalertune._errors.DamagedEvidence`, named in one line, and its run is shown with
its record unread (:class:`UnreadRecord`).
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from scalertune import _limits
from scalertune._amp._check import CheckPolicy
from scalertune._amp._config import AmpConfig
from scalertune._amp._watch import ScalerPrediction
from scalertune._errors import DamagedEvidence, UsageError
from scalertune._inrun._gap import Check
from scalertune._inrun._lines import Action

#: The record's format, stored with it. 2: this record. 1: a record stored before it had a
#: version (the same keys and values).
VERSION = 2
#: Checks kept in the record: past it the check thins the older ones evenly.
KEPT_CHECKS = 512
#: The longest text a record holds (a path, a host, an action's line).
MAX_TEXT = 2**16
#: An action's kind: a short word (``island``, ``float32``, ``none``...).
_KIND = re.compile(r"[a-z0-9_]{1,32}")


class NotARunRecord(DamagedEvidence):
    """A value under the runs' prefix that is no run's record at all (see the module): left
    out of the report."""


@dataclasses.dataclass(frozen=True)
class Predicted:
    """What the search predicted the scaler does, as the record keeps it: over its
    ``horizon``, the steps it skips, and its lowest and last scale."""

    horizon: int
    skipped_steps: int
    min_scale: float
    final_scale: float

    @classmethod
    def of(cls, prediction: ScalerPrediction) -> Predicted:
        """The record's part of the result file's prediction."""
        return cls(**{f.name: getattr(prediction, f.name) for f in dataclasses.fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _damaged(name: str, why: str) -> DamagedEvidence:
    return DamagedEvidence(f"{name} is damaged: it {why}")


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**62


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _version(value: Any, name: str) -> int:
    if value is None:  # stored before the record had a version
        return 1
    if not _is_integer(value) or not 0 < value <= VERSION:
        raise _damaged(name, f"is not a version this scalertune reads ({VERSION})")
    return int(value)


def _text(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise _damaged(name, "is not text")
    return value


def _mapping(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise NotARunRecord(f"{name} is not a mapping: no run's record")
    return value


def _policy(value: Any, name: str) -> CheckPolicy:
    """The policy, as its writer wrote it: every part it always writes is there."""
    try:
        policy = CheckPolicy.from_dict(_mapping(value, name))
    except UsageError as exc:
        raise _damaged(name, f"is not a check's policy ({exc})") from None
    # as a run writes it: every field it writes there (a default spelled out is the same)
    if any(value.get(k) != v for k, v in policy.to_dict().items()):
        raise _damaged(name, "is not a check's policy as a run writes it")
    return policy


def _config(value: Any, name: str) -> AmpConfig:
    try:
        return AmpConfig.from_dict(_mapping(value, name))
    except UsageError as exc:
        raise _damaged(name, f"is not an AMP config ({exc})") from None


def _steps(value: Any, name: str) -> int:
    if not isinstance(value, int):
        raise NotARunRecord(f"{name} is not a count of steps: no run's record")
    return _count(value, name)


def _count(value: Any, name: str) -> int:
    if value is None:  # none skipped, as the report always read it
        return 0
    if not _is_integer(value):
        raise _damaged(name, "is not a count of steps")
    return int(value)


def _items(value: Any, name: str, most: int) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise NotARunRecord(f"{name} is not a list: no run's record")
    if len(value) > most:
        raise _damaged(name, f"holds more than {most:,}")
    return value


def _checks(value: Any, name: str) -> tuple[Check, ...]:
    """Each check as ``[step, loss, float32's loss]``: a loss may be NaN or infinite (an
    overflow is what the check looks for)."""
    checks = _items(value, name, KEPT_CHECKS)
    if not all(
        isinstance(c, list)
        and len(c) == 3
        and _is_integer(c[0])
        and _is_number(c[1])
        and _is_number(c[2])
        for c in checks
    ):
        raise _damaged(name, "holds a check that is not [step, loss, float32's loss]")
    return tuple(Check(int(s), float(o), float(f)) for s, o, f in checks)


def _actions(value: Any, name: str) -> tuple[Action, ...]:
    actions = _items(value, name, _limits.MAX_HORIZON)
    fields = [f.name for f in dataclasses.fields(Action)]
    if not all(isinstance(a, Mapping) and set(a) == set(fields) for a in actions):
        raise _damaged(name, f"holds an action that is not {{{', '.join(fields)}}}")
    done = tuple(Action(**a) for a in actions)
    if not all(
        _is_integer(a.step)
        and isinstance(a.kind, str)
        and _KIND.fullmatch(a.kind)
        and isinstance(a.line, str)
        and len(a.line) <= MAX_TEXT
        for a in done
    ):
        raise _damaged(name, "holds an action whose step, kind or line is not one")
    return done


def _scale(value: Any, name: str) -> float | None:
    """The loss scale now: from 0 to infinity (float32's scale can grow past its largest)."""
    if value is None:
        return None
    if not _is_number(value) or not value >= 0:  # NaN is no scale
        raise _damaged(name, "is not a loss scale")
    return float(value)


def _predicted(value: Any, name: str) -> Predicted | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise _damaged(name, "is not a mapping")
    parts: dict[str, Any] = {f.name: value.get(f.name) for f in dataclasses.fields(Predicted)}
    try:  # the result file's own bounds
        read = ScalerPrediction(**parts)
    except UsageError as exc:
        raise _damaged(name, f"is not the search's prediction ({exc})") from None
    return Predicted.of(read)


def _part(
    read: Callable[[Any, str], Any], write: Callable[[Any], Any] = lambda value: value
) -> dict[str, Any]:
    """How a field is stored: read from a stored value (``None`` where the key is missing,
    with the field's name to blame), written as plain data."""
    return {"read": read, "write": write}


def _each(write: Callable[[Any], Any]) -> Callable[[Any], list[Any]]:
    return lambda items: [write(item) for item in items]


_plain = operator.methodcaller("to_dict")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunRecord:
    """A real run's record (see the module's docstring).

    Example:
        >>> from scalertune import AmpConfig, CheckPolicy
        >>> from scalertune._inrun._run_record import RunRecord
        >>> record = RunRecord(policy=CheckPolicy(), config=AmpConfig(dtype="bfloat16"),
        ...                    steps=300, skipped_steps=0)
        >>> RunRecord.from_dict(record.to_dict()) == record
        True
    """

    version: int = dataclasses.field(default=VERSION, metadata=_part(_version))
    #: The host it ran on (written by its log, as the next three: ``None`` in the record
    #: ``amp.report()`` prints).
    host: str | None = dataclasses.field(default=None, metadata=_part(_text))
    #: When it started, as ISO 8601 text.
    started: str | None = dataclasses.field(default=None, metadata=_part(_text))
    #: The result file it loaded.
    yaml: str | None = dataclasses.field(default=None, metadata=_part(_text))
    #: The device it trained on.
    device: str | None = dataclasses.field(default=None, metadata=_part(_text))
    policy: CheckPolicy = dataclasses.field(metadata=_part(_policy, _plain))
    #: The config it trains with now (with the islands and changes its actions made).
    config: AmpConfig = dataclasses.field(metadata=_part(_config, _plain))
    steps: int = dataclasses.field(metadata=_part(_steps))
    skipped_steps: int = dataclasses.field(default=0, metadata=_part(_count))
    #: Every check kept (at most ``KEPT_CHECKS``, thinned evenly beyond).
    checks: tuple[Check, ...] = dataclasses.field(
        default=(), metadata=_part(_checks, _each(operator.methodcaller("to_list")))
    )
    actions: tuple[Action, ...] = dataclasses.field(
        default=(), metadata=_part(_actions, _each(_plain))
    )
    #: The loss scale now; ``None`` for a config without a scaler.
    scale: float | None = dataclasses.field(default=None, metadata=_part(_scale))
    #: What the search predicted the scaler does; ``None`` for a file without a prediction.
    prediction: Predicted | None = dataclasses.field(
        default=None, metadata=_part(_predicted, _plain)
    )

    def to_dict(self) -> dict[str, Any]:
        """The record as plain data, as its study keeps it: a key per field, a part that is
        ``None`` left out."""
        return {
            f.name: f.metadata["write"](value)
            for f in dataclasses.fields(self)
            if (value := getattr(self, f.name)) is not None
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "a run's record") -> RunRecord:
        """The record ``data`` holds, in any version a study may hold.

        Raises:
            NotARunRecord: ``data`` is no run's record at all (see the module).
            DamagedEvidence: A part is not what a run writes, named in one line.
        """
        stored = _mapping(data, where)
        read, damage = {}, None
        for f in dataclasses.fields(cls):  # no run's record, before a damaged one
            try:
                read[f.name] = f.metadata["read"](stored.get(f.name), f"{where}'s {f.name}")
            except NotARunRecord:
                raise
            except DamagedEvidence as exc:
                damage = damage or exc
        if damage is not None:
            raise damage
        return cls(**read)


@dataclasses.dataclass(frozen=True)
class UnreadRecord:
    """A run whose record is damaged (see the module): the report names it, with the result
    file it loaded where that reads, and says that its record cannot be read."""

    #: Why, in one line.
    why: str
    started: str | None = None
    yaml: str | None = None

    @classmethod
    def of(cls, data: Mapping[str, Any], damage: DamagedEvidence) -> UnreadRecord:
        """The run of the damaged record ``data``: its parts that still read."""
        parts = {f.name: f for f in dataclasses.fields(RunRecord)}
        read = {}
        for field in dataclasses.fields(cls):
            if field.name in parts:
                try:
                    read[field.name] = parts[field.name].metadata["read"](
                        data.get(field.name), field.name
                    )
                except DamagedEvidence:
                    continue
        return cls(why=str(damage), **read)


def read_run(data: Any, where: str) -> RunRecord | UnreadRecord:
    """The run whose record ``data`` is: its :class:`RunRecord`, or an :class:`UnreadRecord`
    for a damaged one.

    Raises:
        NotARunRecord: ``data`` is no run's record at all.
    """
    try:
        return RunRecord.from_dict(data, where)
    except NotARunRecord:
        raise
    except DamagedEvidence as damage:
        return UnreadRecord.of(data, damage)
