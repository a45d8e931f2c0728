"""The float32 reference's checkpoints in the study's artifact store: their names, where the
reference saves them, the latest good one to resume from, and the rebuild of one that is lost.

The reference to the horizon saves a checkpoint at the start of every phase window (the
finalists branch from there), every quarter of the horizon, and every ``CHECKPOINT_EVERY_S``
of training into two slots in turn. Each is stored with its checksum
(:mod:`scalertune._storage._checkpoints`) in the study's artifact store, where every worker of
the study reaches it, on this host or another.

A checkpoint reads back whole when its file matches its manifest (and the study key's
signature, where one is set) and reads as a checkpoint of the step it names, with nothing in
it run (:mod:`scalertune._run._checkpoint_file`); a file that a run then finds was saved from
another model is refused until it is written again. A reference that was interrupted resumes
from the latest checkpoint that reads back whole; each damaged one is named in one line and
passed over for the one before, or step 0, and where the run starts is said. A
window's checkpoint that is missing or damaged when a branch needs it is rebuilt by one
worker while the others wait: float32 trained again from its latest good checkpoint before
that step (or from step 0), which replays the same steps (the checkpoint holds every random
state and the data position). A checkpoint that cannot be had is missing evidence for the
run that needs it, never a verdict on its config.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable
from typing import TypeVar

import optuna

from scalertune._amp._config import AmpConfig
from scalertune._errors import DamagedCheckpoint, MissingEvidence
from scalertune._run._checkpoint import SaveSchedule
from scalertune._run._checkpoint_file import read_checkpoint
from scalertune._run._loop import Plan, Watcher
from scalertune._run._record import RunRecord
from scalertune._search import _policy as _search_policy
from scalertune._search._isolate import describe_error, execute
from scalertune._search._setup import Setup
from scalertune._search._study import instance
from scalertune._storage._checkpoints import StoredCheckpoint, digest_of_file
from scalertune._storage._claims import Once
from scalertune._storage._store import Store, location_of, plain

_T = TypeVar("_T")

#: A reference to the horizon saves a checkpoint to resume from this often (as a share of it),
#: besides every ``CHECKPOINT_EVERY_S`` of training.
_RESUME_EVERY = 0.25


class Checkpoints:
    """The study's checkpoints: float32's, and the finalists' own (see the module)."""

    def __init__(
        self,
        study: optuna.Study,
        once: Once,
        setup: Setup,
        config: AmpConfig,
        *,
        log: Callable[[str], None],
    ) -> None:
        self.study, self.once, self.setup, self.config, self.log = (study, once, setup, config, log)
        #: Which checkpoints read back whole, and the files a run refused.
        self.reader = _Reader(log)

    @functools.cached_property
    def store(self) -> Store:
        """The study's artifact store, read where the study records it: first inside the
        float32 reference's claim, which settles after racing creators' writes, so every
        worker reads the same (as :func:`~scalertune._search._study.instance`); the place
        this worker was given (``--artifact-dir``), where it was, is that place."""
        return Store(location_of(self.study, self.setup.artifact_dir))

    @functools.cached_property
    def prefix(self) -> str:
        """What this study's checkpoints are named by: the study's name and its instance
        token, so that a study made again under the same name (a new database, a deleted name
        used again) does not resume from another's checkpoints."""
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", self.study.study_name)[:80]
        return f"{name}-{instance(self.study)}"

    def stored(self, name: str) -> StoredCheckpoint:
        """The study's checkpoint ``name`` (a finalist's own, or float32's)."""
        return StoredCheckpoint(self.store, f"{self.prefix}.{name}")

    def fetch(self, stored: StoredCheckpoint) -> str:
        """``stored``'s file here, read back whole (see the module);
        :class:`~scalertune._errors.DamagedCheckpoint` or :class:`MissingEvidence` naming it
        otherwise."""
        return self.reader.fetch(stored)

    def refuse(self, path: str, said: str, log: Callable[[str], None] | None = None) -> None:
        """The file at ``path`` (as :meth:`fetch` gave it) did not load into a run: said in
        one line (``said``, to ``log`` or the study's), and refused until written again."""
        self.reader.refuse(path, said, log)

    def branching(self, get: Callable[[], str], run: Callable[[str], _T]) -> _T:
        """``run`` of the checkpoint file ``get`` gives (:meth:`get`); where the run finds it
        damaged, the file is refused (:meth:`refuse`) and ``run`` goes once more, from the
        file ``get`` gives then (rebuilt). A second damaged one is missing evidence."""
        for last in (False, True):
            path = get()
            try:
                return run(path)
            except DamagedCheckpoint as exc:
                if last:
                    raise
                self.refuse(path, f"{exc}: passed over")
        raise AssertionError("unreachable")

    def run_resuming(
        self, watcher: Callable[[], Watcher | None], run: Callable[[Plan], RunRecord]
    ) -> RunRecord:
        """The reference's run to the horizon (``run`` of its plan: :meth:`plan`), again
        from an earlier checkpoint, or step 0, each time the one it resumed from turns out
        damaged as the run loads it. Each time refuses one file more, so it ends."""
        while True:
            plan = self.plan(watcher())
            try:
                return run(plan)
            except DamagedCheckpoint as exc:
                if plan.checkpoint is None:  # nothing was loaded: not a file's fault
                    raise
                self.refuse(plan.checkpoint, f"{exc}: passed over")

    def plan(self, watcher: Watcher | None) -> Plan:
        """The reference's run to the horizon: where it saves, and the latest good checkpoint
        of an interrupted run to resume from."""
        fixed = {step: self._at(step) for step in self._fixed_steps()}
        slots = self._slots()
        schedule = SaveSchedule(fixed, slots=slots, every_s=_search_policy.CHECKPOINT_EVERY_S)
        found, passed = self.reader.latest_good(
            [*fixed.values(), *slots], before=self.setup.horizon
        )
        if found is None:
            if passed:
                self.log(
                    "float32 reference: no checkpoint of it reads back whole: training from step 0"
                )
            return Plan(save_at=schedule, watcher=watcher)
        step, path = found
        self.log(f"float32 reference: resuming from its checkpoint at step {step}")
        return Plan(save_at=schedule, checkpoint=path, resume=True, watcher=watcher)

    def phase_names(self) -> dict[int, str]:
        """Each phase window's start -> the name of float32's checkpoint there."""
        return {start: self._at(start).name for start, _ in self.setup.windows}

    def get(self, name: str, step: int) -> str:
        """float32's checkpoint ``name``, of step ``step``, checked, as a file here; rebuilt
        first where it is missing or damaged (see the module). :class:`MissingEvidence`
        when it cannot be had. A name that is not a plain file name (a path, from a study
        written before the artifact store, or by someone else) is never opened: the
        checkpoint is the one this study saves at ``step``."""
        stored = StoredCheckpoint(self.store, name) if plain(name) else self._at(step)
        try:
            return self.fetch(stored)
        except MissingEvidence as exc:
            why = str(exc)
        self.once(
            f"rebuild.{step}",
            lambda: self._rebuild(step, stored, why),
            lambda: self.reader.good(stored),
        )
        return self.fetch(stored)

    def remove(self) -> None:
        """Remove float32's checkpoints (a study refused before its first trial)."""
        self.store.remove([c.name for c in (*map(self._at, self._fixed_steps()), *self._slots())])

    def _fixed_steps(self) -> list[int]:
        horizon = self.setup.horizon
        quarters = {round(horizon * k * _RESUME_EVERY / 10) * 10 for k in range(1, 4)}
        starts = {start for start, _ in self.setup.windows}
        return sorted(step for step in starts | quarters if step > 0)

    def _at(self, step: int) -> StoredCheckpoint:
        return self.stored(f"reference-seed{self.setup.seed}-step{step}.pt")

    def _slots(self) -> tuple[StoredCheckpoint, StoredCheckpoint]:
        """The two checkpoints saved in turn every ``CHECKPOINT_EVERY_S``."""
        seed = self.setup.seed
        return (
            self.stored(f"reference-seed{seed}-every-a.pt"),
            self.stored(f"reference-seed{seed}-every-b.pt"),
        )

    def _rebuild(self, step: int, stored: StoredCheckpoint, why: str) -> None:
        """Train float32 again to ``step`` and save its checkpoint there as ``stored`` (from
        an earlier checkpoint, or one earlier still where that one does not load)."""
        while True:
            earlier, _ = self.reader.latest_good(
                [*(self._at(s) for s in self._fixed_steps() if s < step), *self._slots()],
                before=step,
            )
            origin = 0 if earlier is None else earlier[0]
            self.log(f"{why}: training float32 again from step {origin} to {step} to rebuild it")
            plan = Plan(checkpoint=None if earlier is None else earlier[1], save_at={step: stored})
            try:
                execute(self.setup, self.config, steps=step, seed=self.setup.seed, plan=plan)
                return
            except DamagedCheckpoint as exc:
                if earlier is None:
                    raise
                self.refuse(earlier[1], f"{exc}: passed over")
            except MissingEvidence:
                raise
            except Exception as exc:  # float32 trained this far once: whatever stops it now
                raise MissingEvidence(
                    f"{why}, and training float32 again to rebuild it failed: {describe_error(exc)}"
                ) from None


class _Reader:
    """Which of the study's checkpoints read back whole (see the module): each fetched and
    checked, the files a run refused, and the latest good one of several."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        #: The digests of files a run found damaged: refused until written again.
        self._refused: set[str] = set()

    def fetch(self, stored: StoredCheckpoint) -> str:
        """``stored``'s file here, read back whole (see the module);
        :class:`~scalertune._errors.DamagedCheckpoint` or :class:`MissingEvidence` naming it
        otherwise."""
        path, manifest = stored.fetch_checked()
        if manifest["sha256"] in self._refused:
            raise DamagedCheckpoint(
                f"{stored.describe()} is damaged: a run found it does not fit the workload"
            )
        try:
            read_checkpoint(path, step=manifest["step"], mmap=True)
        except DamagedCheckpoint as exc:
            raise DamagedCheckpoint(f"{stored.describe()} is damaged: {_why(exc)}") from None
        return path

    def refuse(self, path: str, said: str, log: Callable[[str], None] | None = None) -> None:
        """The file at ``path`` (as :meth:`fetch` gave it) did not load into a run: said in
        one line (``said``, to ``log`` or the study's), and refused until written again."""
        (log or self.log)(said)
        with contextlib.suppress(OSError):  # gone since: nothing left to refuse
            self._refused.add(digest_of_file(path))

    def latest_good(
        self, candidates: list[StoredCheckpoint], *, before: int
    ) -> tuple[tuple[int, str] | None, bool]:
        """The latest of ``candidates`` at a step before ``before`` that reads back whole, as
        (step, file), or None; and whether any was passed over. Each damaged one is said in
        one line and passed over; one a run refused (:meth:`refuse`) was said then."""
        found, passed = [], False
        for candidate in candidates:
            try:
                manifest = candidate.manifest()
            except MissingEvidence as exc:
                self.log(f"{exc}: passed over")
                passed = True
                continue
            if manifest is None or not 0 < manifest["step"] < before:
                continue
            if manifest["sha256"] in self._refused:
                passed = True
            else:
                found.append((int(manifest["step"]), candidate))
        for step, candidate in sorted(found, key=lambda f: f[0], reverse=True):
            try:
                return (step, self.fetch(candidate)), passed
            except MissingEvidence as exc:
                self.log(f"{exc}: passed over")
                passed = True
        return None, passed

    def good(self, stored: StoredCheckpoint) -> bool:
        try:
            self.fetch(stored)
        except MissingEvidence:
            return False
        return True


def _why(exc: DamagedCheckpoint) -> str:
    """What :func:`~scalertune._run._checkpoint_file.read_checkpoint` found wrong, without
    the file's name (which names a bucket's checkpoint by its digest)."""
    return str(exc).partition(" is damaged: ")[2] or str(exc)
