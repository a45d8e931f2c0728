"""A search whose runs span hosts, under the user's own launcher (``torchrun --nnodes N``,
``srun``): every rank runs the same ``scalertune search`` command; global rank 0 leads.

The launcher's processes are the **crew**: they stay up for the whole search and never train
themselves. For each run, each of them starts one process of its own, as
:class:`~scalertune._processes._launcher.Launch` does on one host (it dies with its parent,
under the same time and memory limits), and these processes form the run's
``torch.distributed`` group, with rank 0's on a fresh port, before the factory is called.
The crew speaks through one ``TCPStore``: torchrun's agent's on node 0, or rank 0's own
under ``srun``.

- Rank 0 alone opens the study, asks Optuna, records and writes the answer. It posts each
  run (``job/N``: the job, pickled from scalertune's own records only, and the run's port),
  runs its own part, then collects every rank's report (``done/N/R``).
- A rank past 0 (:meth:`Crew.follow`) waits for the next run, runs its part and reports, up
  to the ``stop`` rank 0 posts with the exit status; it never touches the storage.

Faults are bounded in time. A rank whose run fails makes its peers' collectives fail at
once; rank 0 gives the others ``SETTLE_S`` to report, then asks those still at work to end
theirs (``abort/N``), and names the rank to blame, with its node and host. A rank that does
not report even then, and a rank 0 that stops answering (its store gone, or its heartbeat
still for ``host_timeout``), is a lost host: the run is missing evidence (retried by the
rerun, never a verdict), and the search ends on every host with status 3. A rank whose
process is gone is known at once, whatever it was doing, by its lifeline: one connection to
rank 0 it holds for the whole search (:class:`_Lifelines`); a host that stops without
closing it (frozen, cut off) by its pulse, still for ``host_timeout``.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import pickle
import select
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from scalertune._errors import MissingEvidence
from scalertune._processes._launcher import TIMED_OUT, Launch
from scalertune._processes._protocol import (
    Done,
    Failed,
    Final,
    Job,
    RankFailed,
    Reply,
    TrialCrashed,
)
from scalertune._processes._world import World

#: After a rank's run fails, how long (seconds) rank 0 waits for the others' reports before
#: it asks those still at work to end theirs: across hosts a peer's collective fails within
#: a second of a death, and its report takes a round trip to the store.
SETTLE_S = 10.0
#: How often (seconds) rank 0 beats while it thinks between runs, and the others look for
#: the next run.
BEAT_S = 2.0
_POLL_S = 0.2
#: The status a rank ends with when a host is lost (the command line's for missing evidence).
EXIT_LOST = 3


class HostLost(MissingEvidence):
    """A rank (its host, or its process) stopped answering: the run's evidence is missing,
    and the search cannot go on without the rank; the same command on every host resumes
    it."""


class Crew:
    """The launcher's ranks, joined through the store (see the module's docstring)."""

    def __init__(self, world: World, store: Any, roster: list[dict[str, Any]], host_timeout: float):
        self.world, self._store, self._roster = world, store, roster
        self._host_timeout = host_timeout
        self._n = 0
        self._lost: str | None = None
        self._beating = threading.Event()
        #: A rank past 0: the deadline its store's calls go through (:class:`_Watched`).
        self._deadline: _Deadline | None = None
        #: Rank 0: the other ranks' lifelines; a rank past 0: its own end of its lifeline.
        self._lifelines: _Lifelines | None = None
        self._lifeline: socket.socket | None = None

    # -- joining ----------------------------------------------------------------------------

    @classmethod
    def join(cls, world: World, *, rendezvous_timeout: float, host_timeout: float) -> Crew:
        """Every rank's place said in the store, rank 0 waiting for all of them and posting
        the roster; :class:`HostLost` naming the ranks that did not come in
        ``rendezvous_timeout`` seconds."""
        deadline = None
        if world.rank != 0:
            where = f"rank 0 ({world.master_addr}:{world.master_port})"
            deadline = _Deadline(where, rendezvous_timeout, "--rendezvous-timeout")
        store = _connect(world, rendezvous_timeout)
        if deadline is not None:
            store = _Watched(store, deadline)
        lifelines = _Lifelines(world.size) if world.rank == 0 else None
        if lifelines is not None:
            store.set("lifeline", str(lifelines.port))
        roster = _gather(world, store, rendezvous_timeout)
        store.set_timeout(datetime.timedelta(seconds=host_timeout))
        crew = cls(world, store, roster, host_timeout)
        crew._deadline, crew._lifelines = deadline, lifelines
        if world.rank != 0:
            crew._lifeline = _hold_lifeline(world, int(store.get("lifeline")), rendezvous_timeout)
        if world.rank == 0:
            args = (world, host_timeout, crew._beating)
            threading.Thread(target=_beat, args=args, name="scalertune-beat", daemon=True).start()
        return crew

    def where(self, rank: int) -> str:
        """``rank 1 of 2 (node 1, host-b)``."""
        entry = self._roster[rank]
        return f"rank {rank} of {self.world.size} (node {entry['node']}, {entry['host']})"

    def other_command(self) -> int | None:
        """The first rank whose command line differs from rank 0's (``None``: all agree)."""
        first = self._roster[0].get("argv")
        return next((r for r, e in enumerate(self._roster) if e.get("argv") != first), None)

    def argv_difference(self, rank: int) -> str:
        """Where ``rank``'s command line first differs from rank 0's, in words (a storage
        URL's password hidden)."""
        from scalertune._storage._redact import redact

        ours, theirs = self._roster[0].get("argv") or [], self._roster[rank].get("argv") or []
        for i, (a, b) in enumerate(zip(ours, theirs)):
            if a != b:
                flag = ours[i - 1] if i and str(ours[i - 1]).startswith("--") else None
                where = f"after {flag}, " if flag else ""
                return f"{where}rank 0 has {redact(str(a))!r} where it has {redact(str(b))!r}"
        longer, extra = (ours, "rank 0") if len(ours) > len(theirs) else (theirs, "it")
        return f"{extra} also has {redact(str(longer[min(len(ours), len(theirs))]))!r}"

    @property
    def nodes(self) -> int:
        return len({entry["node"] for entry in self._roster})

    @property
    def hosts(self) -> list[str]:
        """Each node's host name, in node order."""
        names = {entry["node"]: entry["host"] for entry in self._roster}
        return [names[node] for node in sorted(names)]

    # -- rank 0 -----------------------------------------------------------------------------

    def launch(
        self, job: Job[Any], timeout_s: float | None, progress: Callable[[Reply], None]
    ) -> Final:
        """``job`` run by every rank: rank 0's result, its progress handed to ``progress``;
        the run's failure raised as on one host, the rank blamed named with its host."""
        if self._lost is not None:
            raise HostLost(self._lost)
        self._n += 1
        n, port = self._n, _free_port()
        if self._gone():  # a rank's process is gone already: this run could never end
            raise HostLost(self._lost_line(min(self._gone()), None))
        started = time.monotonic()
        self._store.set(f"job/{n}", b"J" + pickle.dumps((job, port, timeout_s)))
        own = _perform(
            job,
            timeout_s,
            self.world.run_env(port),
            progress,
            _watch_peers(self.world, self._host_timeout, n, self._gone),
        )
        reports = self._collect(n, own["kind"] == "ok", started)
        if own["kind"] == "ok" and all(r["kind"] == "ok" for r in reports.values()):
            return own["final"]
        raise _blamed(self.where, {0: own, **reports})

    def _collect(self, n: int, ok: bool, started: float) -> dict[int, dict[str, Any]]:
        """Every other rank's report of run ``n``; after a failure, those still at work after
        ``SETTLE_S`` are asked to end it; :class:`HostLost` for a rank that never reports (no
        wait for one whose process is gone)."""
        keys = {f"done/{n}/{r}": r for r in range(1, self.world.size)}

        def only_the_gone_left(came: set[str]) -> bool:
            return all(r in self._gone() for k, r in keys.items() if k not in came)

        wait = self._host_timeout if ok and not self._gone() else SETTLE_S
        came = _poll(self._store, list(keys), wait, stop=only_the_gone_left)
        if len(came) < len(keys):
            self._store.set(f"abort/{n}", "1")
            came = _poll(self._store, list(keys), SETTLE_S, stop=only_the_gone_left)
        missing = [r for k, r in keys.items() if k not in came]
        if missing:
            gone = [r for r in missing if r in self._gone()]
            raise HostLost(self._lost_line(gone[0] if gone else missing[0], started))
        return {r: json.loads(self._store.get(k)) for k, r in keys.items()}

    def _gone(self) -> set[int]:
        """The ranks whose process is gone (their lifeline closed)."""
        return self._lifelines.gone() if self._lifelines is not None else set()

    def _lost_line(self, rank: int, started: float | None) -> str:
        """The line a lost ``rank`` ends the search with (kept: every later run says it)."""
        if rank in self._gone():
            why = (
                f"{self.where(rank)} is gone: its connection to rank 0 closed (its process "
                "was killed, or its host went down)"
            )
        else:
            waited = 0.0 if started is None else time.monotonic() - started
            why = (
                f"{self.where(rank)} did not report its run within {waited:.0f} s of its "
                "start: its host or its process is gone, or frozen"
            )
        self._lost = (
            f"{why}. The search ends on every host: run the same command on every host "
            "again to resume it"
        )
        return self._lost

    def close(self, code: int) -> None:
        """The search is over on rank 0 with ``code``: the others stop with it (each says
        goodbye, so that the store they read outlives their last read)."""
        self._beating.set()
        try:
            self._store.set(f"job/{self._n + 1}", b"S" + json.dumps({"code": code}).encode())
            _poll(self._store, [f"bye/{r}" for r in range(1, self.world.size)], SETTLE_S)
        except Exception:  # a rank already gone: nothing to stop there
            pass

    # -- the other ranks --------------------------------------------------------------------

    def follow(self) -> int:
        """Rank 1 and up: every run rank 0 posts, run and reported, up to its ``stop``;
        returns rank 0's exit status. :class:`HostLost` when rank 0 stops answering; a
        store that stops answering mid-call (a frozen host) ends the process
        (:class:`_Deadline`)."""
        if self._deadline is not None:
            self._deadline.who, self._deadline.seconds = self.where(0), self._host_timeout
            self._deadline.flag = "--host-timeout"
        try:
            while True:
                self._n += 1
                message = _next_run(self._store, self._n, self._host_timeout)
                if message[:1] == b"S":
                    self._store.set(f"bye/{self.world.rank}", "1")
                    return int(json.loads(message[1:])["code"])
                report = self._run(message[1:])
                self._store.set(f"done/{self._n}/{self.world.rank}", json.dumps(report))
        except (RuntimeError, OSError) as exc:  # torch's DistError is a RuntimeError
            raise HostLost(
                f"{self.where(0)} stopped answering ({str(exc).splitlines()[0][:200]}): "
                "the search ends on this host; run the same command on every host again "
                "to resume it"
            ) from None

    def _run(self, message: bytes) -> dict[str, Any]:
        """This rank's part of the run ``message`` holds, and its report."""
        try:
            job, port, timeout_s = _SafeUnpickler(io.BytesIO(message)).load()
        except (pickle.UnpicklingError, ValueError, TypeError, EOFError) as exc:
            return {"kind": "failed", "failure": "error", "text": f"{exc}"}
        watch = _watch_abort(self.world, self._host_timeout, self._n)
        return _perform(job, timeout_s, self.world.run_env(port), None, watch)


def _gather(world: World, store: Any, rendezvous_timeout: float) -> list[dict[str, Any]]:
    """The roster: every rank's place said in ``store``, rank 0 waiting for all of them and
    posting it, the others reading it; :class:`HostLost` naming the ranks that did not come
    in ``rendezvous_timeout`` seconds, or rank 0 when it did not post it."""
    me = {"rank": world.rank, "node": world.node, "host": world.host, "argv": sys.argv[1:]}
    store.set(f"rank/{world.rank}", json.dumps(me))
    if world.rank == 0:
        keys = [f"rank/{r}" for r in range(world.size)]
        came = _poll(store, keys, rendezvous_timeout)
        if len(came) < world.size:
            missing = [r for r in range(world.size) if f"rank/{r}" not in came]
            nodes = sorted({r // world.local_size for r in missing})
            raise HostLost(
                f"{_ranks(missing)} of {world.size} ({_nodes(nodes)}) did not come within "
                f"{rendezvous_timeout:g} s (--rendezvous-timeout): start the same "
                "command on every host (a host whose command was refused before it came "
                "says why in its own output)"
            )
        roster = [json.loads(store.get(k)) for k in keys]
        store.set("roster", json.dumps(roster))
    elif not _poll(store, ["roster"], rendezvous_timeout):
        raise HostLost(
            f"rank 0 ({world.master_addr}) did not open the search within "
            f"{rendezvous_timeout:g} s (--rendezvous-timeout): its own output says why where "
            "its command was refused"
        )
    else:
        roster = json.loads(store.get("roster"))
    return roster


def _beat(world: World, host_timeout: float, stop: threading.Event) -> None:
    """Rank 0's heartbeat, on a connection of its own, while the search lasts (up to
    ``stop``)."""
    store, beat = _connect(world, host_timeout, client=True), 0
    while not stop.wait(BEAT_S):
        beat += 1
        try:
            store.set("beat", str(beat))
        except Exception:  # the store is gone: the search is ending
            return


def _next_run(store: Any, n: int, host_timeout: float) -> bytes:
    """Run ``n``'s message, once posted; rank 0 lost when its heartbeat (:func:`_beat`)
    stops for ``host_timeout``."""
    key, last, since = f"job/{n}", None, time.monotonic()
    while not store.check([key]):
        beat = store.get("beat") if store.check(["beat"]) else None
        if beat != last:
            last, since = beat, time.monotonic()
        elif time.monotonic() - since > host_timeout:
            raise RuntimeError(f"no heartbeat for {host_timeout:g} s (--host-timeout)")
        time.sleep(_POLL_S)
    return bytes(store.get(key))


def _blamed(where: Callable[[int], str], reports: dict[int, dict[str, Any]]) -> BaseException:
    """The failure to raise, in the order of :mod:`._blame`: a rank whose process died, a
    rank whose own code failed, a rank ended while the others had failed (it hung), else the
    first collective error. A run whose every rank that crashed ran past the time limit is
    said as on one host, no rank blamed: each host kills its ranks at the same limit."""
    crashed = [rep for rep in reports.values() if rep["kind"] == "crashed"]
    if (
        crashed
        and all(rep["text"].startswith(TIMED_OUT) for rep in crashed)
        and all(  # the others ended at rank 0's word, or in a collective the kill broke
            rep["kind"] == "aborted" or (rep["kind"] == "failed" and _peer(rep))
            for rep in reports.values()
            if rep["kind"] != "crashed"
        )
    ):
        return RankFailed(crashed[0]["text"])
    for kind, make in (
        ("crashed", lambda r, rep: RankFailed(f"{where(r)}: {rep['text']}")),
        ("failed", lambda r, rep: Failed(rep["failure"], f"{where(r)}: {rep['text']}")),
        ("aborted", lambda r, rep: RankFailed(f"{where(r)} hung: its peers had failed")),
    ):
        for r, rep in sorted(reports.items()):
            if rep["kind"] == kind and (kind != "failed" or not _peer(rep)):
                made = make(r, rep)
                return made.exception() if isinstance(made, Failed) else made
    r, rep = min((r, rep) for r, rep in reports.items() if rep["kind"] == "failed")
    return Failed("error", f"{where(r)}: {rep['text']}").exception()


def _watch_peers(
    world: World, host_timeout: float, n: int, gone: Callable[[], set[int]]
) -> Callable[[Launch], None]:
    """A watch, on a connection of its own, that ends rank 0's part of run ``n`` when
    another rank reports a failure and rank 0's part does not end by itself within
    ``SETTLE_S``, at once when another rank's process is ``gone`` (its lifeline closed), or
    when another rank's pulse (``alive/R``) stays still for ``host_timeout`` (a frozen
    host): rank 0's part may wait on a group that rank will never join."""
    done = [f"done/{n}/{r}" for r in range(1, world.size)]
    pulses = [f"alive/{r}" for r in range(1, world.size)]

    def watch(launch: Launch) -> None:
        store = _connect(world, host_timeout, client=True)
        seen: dict[str, tuple[bytes | None, float]] = {}
        while not launch.over.wait(_POLL_S * 2.5):
            try:
                failed = any(
                    store.check([k]) and json.loads(store.get(k))["kind"] != "ok" for k in done
                )
                now = time.monotonic()
                for k in pulses:
                    pulse = store.get(k) if store.check([k]) else None
                    if k not in seen or seen[k][0] != pulse:
                        seen[k] = (pulse, now)
            except Exception:  # the store is going: the run ends by itself
                return
            still = any(now - since > host_timeout for _, since in seen.values()) or gone()
            if still or failed:
                if still or not launch.over.wait(SETTLE_S):
                    launch.kill()
                return

    return watch


def _watch_abort(world: World, host_timeout: float, n: int) -> Callable[[Launch], None]:
    """A watch, on a connection of its own, that beats this rank's pulse while its part of
    run ``n`` lasts, and ends it when rank 0 asks."""

    def watch(launch: Launch) -> None:
        store, pulse = _connect(world, host_timeout, client=True), 0
        while not launch.over.wait(_POLL_S * 2.5):
            pulse += 1
            try:
                store.set(f"alive/{world.rank}", str(pulse))
                if store.check([f"abort/{n}"]):
                    launch.kill()
                    return
            except Exception:  # rank 0 gone: its peers' collectives end this run
                return

    return watch


def _perform(
    job: Job[Any],
    timeout_s: float | None,
    env: dict[str, str],
    progress: Callable[[Reply], None] | None,
    watch: Callable[[Launch], None] | None = None,
) -> dict[str, Any]:
    """This rank's part of a run, in a process of its own; its report: ``ok`` (with rank 0's
    ``final``), ``failed`` (the job raised: its failure kind), ``crashed`` (the process died
    or ran past its time) or ``aborted`` (ended at rank 0's word)."""
    launch = Launch(job, timeout_s, envs=[env])
    if watch is not None:
        threading.Thread(target=watch, args=(launch,), daemon=True).start()
    try:
        for reply in launch:
            if isinstance(reply, Failed):
                return {"kind": "failed", "failure": reply.kind, "text": reply.text}
            if isinstance(reply, (Final, Done)):
                return {"kind": "ok", "final": reply} if progress else {"kind": "ok"}
            if progress is not None:
                progress(reply)
    except TrialCrashed as exc:
        return {"kind": "aborted" if launch.killed else "crashed", "text": str(exc)}
    finally:
        launch.over.set()
    return {"kind": "crashed", "text": "the run's process ended without a result"}


def _connect(world: World, timeout_s: float, *, client: bool = False) -> Any:
    """The crew's store: torchrun's agent's, or rank 0's (a client of it unless ``client``
    is false on rank 0 without an agent)."""
    master = world.rank == 0 and not world.agent_store and not client
    try:
        store = torch.distributed.TCPStore(
            world.master_addr,
            world.master_port,
            is_master=master,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    except (RuntimeError, OSError) as exc:
        raise HostLost(
            f"rank {world.rank} could not reach the rendezvous at {world.master_addr}:"
            f"{world.master_port} within {timeout_s:g} s (--rendezvous-timeout): start the "
            f"same command on every host, with the same MASTER_ADDR and MASTER_PORT "
            f"({str(exc).splitlines()[0][:160]})"
        ) from None
    return torch.distributed.PrefixStore("scalertune/", store)


def _poll(
    store: Any,
    keys: list[str],
    timeout_s: float,
    *,
    stop: Callable[[set[str]], bool] | None = None,
) -> set[str]:
    """The ``keys`` set in ``store`` within ``timeout_s`` seconds (all of them, or those
    there when the time ran out, or when ``stop`` says of those that no more will come)."""
    deadline, came = time.monotonic() + timeout_s, set()
    while True:
        came |= {k for k in keys if k not in came and store.check([k])}
        if len(came) == len(keys) or time.monotonic() >= deadline:
            return came
        if stop is not None and stop(came):
            return came
        time.sleep(_POLL_S)


class _Lifelines:
    """Rank 0's end of one TCP connection per other rank's crew process, open for the
    whole search: one that closes is a rank whose process is gone (killed, or its host's
    processes ended), known at once. Without it, a rank that dies before its part of a run
    has joined the run's group leaves rank 0's part waiting on that group (its timeout) and
    the rank's pulse still for ``--host-timeout``: 5 minutes by default. (A host that stops
    without closing its connections, frozen or cut off, is still the pulse's to find.)"""

    def __init__(self, size: int) -> None:
        dual = socket.has_dualstack_ipv6()
        self._server = socket.create_server(
            ("", 0), family=socket.AF_INET6 if dual else socket.AF_INET, dualstack_ipv6=dual
        )
        self.port = int(self._server.getsockname()[1])
        self._size, self._gone = size, set[int]()
        threading.Thread(target=self._watch, name="scalertune-lifelines", daemon=True).start()

    def gone(self) -> set[int]:
        return set(self._gone)

    def _watch(self) -> None:
        held: dict[socket.socket, int | None] = {}  # a connection -> the rank it said it is
        while True:
            ready, _, _ = select.select([self._server, *held], [], [])
            for conn in ready:
                if conn is self._server:
                    held[conn.accept()[0]] = None
                    continue
                try:
                    said = conn.recv(64)
                except OSError:
                    said = b""
                if said and held[conn] is None:  # its first word: its rank
                    word = said.strip()
                    ok = word.isdigit() and 0 < int(word) < self._size
                    held[conn] = int(word) if ok else -1
                elif not said:  # closed
                    rank = held.pop(conn)
                    conn.close()
                    if rank is not None and rank > 0:
                        self._gone.add(rank)


def _hold_lifeline(world: World, port: int, timeout_s: float) -> socket.socket:
    """A rank past 0's end of its lifeline to rank 0 (:class:`_Lifelines`), held open until
    the process ends."""
    try:
        conn = socket.create_connection((world.master_addr, port), timeout=timeout_s)
        conn.sendall(f"{world.rank}\n".encode())
    except OSError as exc:
        raise HostLost(
            f"rank {world.rank} could not reach rank 0 at {world.master_addr}:{port} within "
            f"{timeout_s:g} s (--rendezvous-timeout): rank 0's host must take connections on "
            f"any unprivileged port, as each run's group needs ({exc.strerror or exc})"
        ) from None
    conn.settimeout(None)
    return conn


class _Deadline:
    """A rank past 0's watch on its calls to rank 0's store: one still waiting after
    ``seconds`` ends the process, in one line and with status 3. A host that stops without
    closing its connections (frozen, cut off) leaves a call waiting in ``recv`` whatever the
    store's own timeout."""

    def __init__(self, who: str, seconds: float, flag: str) -> None:
        self.who, self.seconds, self.flag = who, seconds, flag
        self._since: float | None = None
        threading.Thread(target=self._watch, name="scalertune-deadline", daemon=True).start()

    def call(self, method: Callable[..., Any], *args: Any) -> Any:
        self._since = time.monotonic()
        try:
            return method(*args)
        finally:
            self._since = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            since = self._since
            if since is not None and time.monotonic() - since > self.seconds:
                print(
                    f"scalertune search: {self.who} stopped answering (its store did not "
                    f"answer for {self.seconds:g} s, {self.flag}): the search ends on this "
                    "host; run the same command on every host again to resume it",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(EXIT_LOST)


class _Watched:
    """A store whose every call goes through a :class:`_Deadline`: a rank past 0's view of
    rank 0's store, from the rendezvous on."""

    def __init__(self, inner: Any, deadline: _Deadline) -> None:
        self.inner, self._deadline = inner, deadline

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        return lambda *args: self._deadline.call(method, *args)


def _peer(report: dict[str, Any]) -> bool:
    """Whether a rank's failure is a collective that broke under it because a peer failed
    first: said so by the run's process, or in its text where the user's code wrapped it (a
    factory's error around the group's)."""
    text = report.get("text", "")
    return report.get("failure") == "peer" or any(m in text for m in _COLLECTIVE_MARKS)


#: What a collective's failure says where a peer went away (gloo's sources, NCCL, torch).
_COLLECTIVE_MARKS = ("/gloo/", "NCCL", "Connection closed by peer", "Connection reset by peer")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _nodes(nodes: list[int]) -> str:
    return ("node " if len(nodes) == 1 else "nodes ") + ", ".join(map(str, nodes))


#: What a run's message may hold besides scalertune's own classes: plain values.
_PLAIN = {
    "builtins": {
        "frozenset",
        "set",
        "tuple",
        "list",
        "dict",
        "complex",
        "slice",
        "range",
        "object",
    },
    "copyreg": {"_reconstructor"},
    "collections": {"OrderedDict"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
}


#: numpy's own pickling of an array and its dtype (an array of objects goes through
#: ``find_class`` again).
_NUMPY = {"_reconstruct", "ndarray", "dtype", "scalar"}


class _SafeUnpickler(pickle.Unpickler):
    """A run's message as rank 0 pickled it: scalertune's own classes and plain values, and
    nothing else (no function, no other module's class), whoever else wrote to the store."""

    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name) if _allowed(module, name) else None
        if module.partition(".")[0] == "scalertune" and not isinstance(found, type):
            found = None
        if found is None:
            raise pickle.UnpicklingError(f"a run's message may not hold {module}.{name}")
        return found


def _allowed(module: str, name: str) -> bool:
    if module.partition(".")[0] == "scalertune":
        return True
    if module == "torch" and name in ("device", "Size"):
        return True
    if module.partition(".")[0] == "numpy" and name in _NUMPY:
        return True
    if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
        return True
    return name in _PLAIN.get(module, ())
