"""The rank a failed job is blamed on, and how a process died.

A rank that dies makes its peers' collectives fail within milliseconds, so the first failure
to arrive is seldom the cause: the parent waits ``RANK_SETTLE_S`` for the others' reports
(:class:`scalertune._processes._launcher.Launch`), then names one rank, in this order: a rank
that died, a rank whose own code failed, a rank that stayed silent while a peer's collective
gave up waiting for it (it hung), else the first collective error.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Literal

from scalertune._processes._main_guard import REENTERED_STATUS, reentered
from scalertune._processes._protocol import Failed


@dataclasses.dataclass(frozen=True)
class Fault:
    """A fault of a process, not of the job: it ``died`` without a reply, or ``hung`` while a
    peer's collective waited for it (the parent raises it as a ``TrialCrashed``)."""

    kind: Literal["died", "hung"]
    text: str


def blame(
    failures: dict[int, Failed | None], exitcodes: list[int | None], silent: list[int]
) -> Failed | Fault:
    """The failure to report: a :class:`Fault` of a process, else a rank's :class:`Failed`
    reply, its text prefixed with the rank when there are ranks. ``failures`` holds each
    failed rank's reply (``None``: it ended without one), ``exitcodes`` every rank's exit
    status, and ``silent`` the ranks that neither failed nor finished."""
    n = len(exitcodes)

    def who(r: int) -> str:
        return "" if n == 1 else f"rank {r} of {n}: "

    for r, reply in sorted(failures.items()):
        if reply is None and exitcodes[r] == REENTERED_STATUS:
            raise reentered()
        if reply is None:
            return Fault("died", who(r) + death(exitcodes[r]))
    for r, reply in sorted(failures.items()):
        if reply is not None and reply.kind != "peer":
            return Failed(reply.kind, who(r) + reply.text)
    first, reply = min(failures.items())  # (every reply is a peer's collective error)
    text = "" if reply is None else reply.text
    if silent:
        return Fault(
            "hung",
            f"rank {silent[0]} of {n} hung: rank {first}'s collective gave "
            f"up waiting for it ({text.splitlines()[0]})",
        )
    return Failed("error", who(first) + text)


def death(exitcode: int | None) -> str:
    """How a process that sent no result ended, from its exit status."""
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        if name == "SIGKILL":
            return (
                "the trial's process was killed (SIGKILL), most often by the operating "
                "system for running out of memory"
            )
        return f"the trial's process died with {name} (a crash in native code)"
    return f"the trial's process exited with status {exitcode} without a result"
