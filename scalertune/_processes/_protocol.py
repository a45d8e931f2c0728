"""What crosses to a job's processes and back.

A job is a small frozen record that the processes receive pickled (a forkserver or a spawned
process imports its class by name): where it runs (``device``), the memory it may take, and
:meth:`Job.perform`, which does it there and returns its result as a :class:`Final` reply.
Each job's records are its own (the search's are in :mod:`scalertune._search._process_jobs`);
the replies every job shares are here: :class:`Done` (a rank past rank 0 finished its part),
and :class:`Failed` (the job raised: its kind says which failure the parent raises).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar, Literal, Protocol, TypeVar

import torch

from scalertune._errors import DamagedCheckpoint, ExitCalled, MissingEvidence, UsageError
from scalertune._storage._outage import Outage


class TrialCrashed(Exception):
    """The run's process died, timed out or ran out of memory, or the run called sys.exit()."""


class RankFailed(TrialCrashed):
    """One rank of a run died or hung: a fault of one process, evidence the run could not
    give, retried (never a verdict on the config)."""


class JobFailed(TrialCrashed):
    """The job raised in its process (the user's code, most often): the exception's line and
    the end of its traceback."""


def exited(exc: SystemExit) -> str:
    how = "os._exit" if isinstance(exc, ExitCalled) else "sys.exit"
    return f"the workload called {how}({exc.code!r}) during the run"


def describe_error(exc: BaseException) -> str:
    """One line for an exception from user code, naming out-of-memory as such."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, torch.OutOfMemoryError) or "CUDA out of memory" in first:
        return f"CUDA out of memory: {first}"
    if (
        isinstance(exc, MemoryError)
        or "can't allocate memory" in first
        or ("not enough memory" in first)
    ):
        return f"out of memory: {first or type(exc).__name__}"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


@dataclasses.dataclass(frozen=True)
class Reply:
    """What a job's process sends while the job runs (progress, in order); the base of every
    reply."""


@dataclasses.dataclass(frozen=True)
class Final(Reply):
    """A job's result: the last reply of a job that did what it was sent to do."""


@dataclasses.dataclass(frozen=True)
class Done(Reply):
    """A rank past rank 0 finished its part: its result is rank 0's to send."""


#: How a job failed: ``error``, it raised (the user's code, most often); ``usage``, bad input;
#: ``peer``, a collective broke under it because another rank failed or hung; ``missing``,
#: ``damaged``, ``outage``: evidence it could not get or read, which is not the run's failure.
FailureKind = Literal["error", "usage", "peer", "missing", "damaged", "outage"]

_RAISED: dict[str, Callable[[str], BaseException]] = {
    "usage": UsageError,
    "missing": MissingEvidence,
    "damaged": DamagedCheckpoint,
    "outage": Outage,
}


@dataclasses.dataclass(frozen=True)
class Failed(Reply):
    """The job raised: ``kind`` says how, ``text`` is its one line (with the traceback's end
    for an ``error``), prefixed with the rank it is blamed on when there are ranks."""

    kind: FailureKind
    text: str

    def exception(self) -> BaseException:
        """The exception the parent raises for it: :class:`JobFailed` for an error, else the
        error the job raised (bad input, missing or damaged evidence, a storage outage)."""
        return _RAISED.get(self.kind, JobFailed)(self.text)


F_co = TypeVar("F_co", bound=Final, covariant=True)


class Job(Protocol[F_co]):
    """A job for :func:`scalertune._processes._launcher.launch`: a picklable record."""

    @property
    def device(self) -> str:
        """Where it runs (``"cpu"``, ``"cuda:0"``); on ranks, each rank's own device of its
        type."""
        ...

    @property
    def memory_gb(self) -> float | None:
        """The address space each process may take, in GiB (``None``: no limit)."""
        ...

    #: The modules the forkserver imports once for this kind of job (torch aside).
    preload: ClassVar[tuple[str, ...]]

    def perform(self, send: Callable[[Reply], None], device: str) -> F_co:
        """Do the job in its process, on ``device``; progress goes to ``send``."""
        ...
