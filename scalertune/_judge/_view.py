"""A study read incrementally: each finished trial checked and read once, and kept.

A search asks its study what to do at every turn: whether to sample more (the stop rule),
whether a sampled config has run already, how fast the best run so far is, what the judge
makes of the evidence (:func:`~scalertune._judge._answer.judge`), whether a queued run
exists. Optuna's storages read a study incrementally already (``_CachedStorage`` over a
database reads only the trials that are new or still running; a journal replays only the
lines it has not read), but what they return is data, never trusted
(:mod:`~scalertune._judge._stored`): every trial is checked before it is judged, and read
into an :class:`~scalertune._judge._outcome.Outcome` or a
:class:`~scalertune._judge._reference.Reference`. Done afresh at every question, that cost
grew as trials x questions: a search of N trials asks about N times.

A trial that has finished (complete, pruned or failed) never changes: Optuna refuses every
write to it. :class:`StudyView` keeps, by trial number, what its check found and the records
read from it, the way Optuna's ``_CachedStorage`` keeps finished trials; a trial that is
waiting or running is checked and read again at each question, as it may still change. One
view serves one :class:`optuna.Study` for a worker's whole search (the search passes it
around); :func:`reference_of` and the other functions here read once, with a view of their
own.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

import optuna
from optuna.trial import FrozenTrial, TrialState

from scalertune._errors import DamagedEvidence
from scalertune._judge._outcome import Outcome, is_run, read_outcome
from scalertune._judge._reference import Reference
from scalertune._judge._stored import Records, checked_trial
from scalertune._storage._names import ROLE_REFERENCE
from scalertune._storage._trial_record import Job, Marks, role_of


class StudyView:
    """One study as a search reads it: trials fetched afresh, finished ones checked once.

    Args:
        study: The study it reads.

    Example:
        >>> view = StudyView(study)  # doctest: +SKIP
        >>> trials, damaged = view.sound(view.trials())  # doctest: +SKIP
        >>> [o.label for o in view.outcomes(trials)]  # doctest: +SKIP
        ['pytorch-default', 'trial #2', 'trial #3']
    """

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
        #: Finished trial's number -> why its evidence is damaged (a sound one: its records).
        self._damage: dict[int, str] = {}
        #: ... -> its run, and its float32 reference (or why that is damaged).
        self._outcomes: dict[int, Outcome] = {}
        self._references: dict[int, Reference | str] = {}
        #: ... -> its records, read in its check.
        self._records: dict[int, Records] = {}

    def trials(self, states: Container[TrialState] | None = None) -> list[FrozenTrial]:
        """The study's trials now (``states`` only, where given), in number order."""
        return self.study.get_trials(deepcopy=False, states=states)

    def sound(self, trials: Iterable[FrozenTrial]) -> tuple[list[FrozenTrial], dict[int, str]]:
        """The ``trials`` whose evidence passes
        :func:`~scalertune._judge._stored.checked_trial`, and the number of each other one ->
        why it is damaged."""
        good, damaged = [], {}
        for trial in trials:
            why = self._damaged(trial)
            if why is None:
                good.append(trial)
            else:
                damaged[trial.number] = why
        return good, damaged

    def outcome(self, trial: FrozenTrial) -> Outcome:
        """``trial`` as an :class:`~scalertune._judge._outcome.Outcome`
        (:meth:`Outcome.from_trial <scalertune._judge._outcome.Outcome.from_trial>`: its
        damage raised as :class:`~scalertune._errors.DamagedEvidence`)."""
        kept = self._outcomes.get(trial.number) if trial.state.is_finished() else None
        if kept is not None:
            return kept
        outcome = read_outcome(trial, self.records(trial))
        if trial.state.is_finished():
            self._outcomes[trial.number] = outcome
        return outcome

    def records(self, trial: FrozenTrial) -> Records:
        """``trial``'s records (:class:`~scalertune._judge._stored.Records`), read once when
        it has finished; its damage raised as :class:`~scalertune._errors.DamagedEvidence`."""
        checked = self._checked(trial)
        if isinstance(checked, str):
            raise DamagedEvidence(checked)
        return checked

    def job(self, trial: FrozenTrial) -> Job | None:
        """``trial``'s job, ``None`` where it is damaged
        (:meth:`Job.sound <scalertune._storage._trial_record.Job.sound>`): a finished trial's
        as its check read it, kept."""
        kept = self._kept(trial)
        return kept.job if kept is not None else Job.sound(trial)

    def marks(self, trial: FrozenTrial) -> Marks:
        """``trial``'s marks, none where they are damaged
        (:meth:`Marks.sound <scalertune._storage._trial_record.Marks.sound>`): a finished
        trial's as its check read them, kept."""
        kept = self._kept(trial)
        return kept.marks if kept is not None else Marks.sound(trial)

    def _kept(self, trial: FrozenTrial) -> Records | None:
        """A finished trial's records, where its evidence is sound (read once); ``None`` for
        one still running (a record alone is read then, not the whole check) or damaged."""
        if not trial.state.is_finished():
            return None
        checked = self._checked(trial)
        return None if isinstance(checked, str) else checked

    def outcomes(self, trials: Iterable[FrozenTrial]) -> list[Outcome]:
        """The finished AMP runs among ``trials`` (:func:`~scalertune._judge._outcome.is_run`)
        whose evidence is sound, in their order."""
        return [self.outcome(t) for t in self.sound(trials)[0] if is_run(t)]

    def reference(self, trial: FrozenTrial) -> Reference:
        """The float32 reference a finished reference ``trial`` stores
        (:meth:`Reference.from_trial <scalertune._judge._reference.Reference.from_trial>`:
        a damaged one raised as :class:`~scalertune._errors.DamagedEvidence`)."""
        kept = self._references.get(trial.number) if trial.state.is_finished() else None
        if kept is None:
            try:
                kept = Reference.from_trial(trial)
            except DamagedEvidence as exc:
                kept = str(exc)
            if trial.state.is_finished():
                self._references[trial.number] = kept
        if isinstance(kept, str):
            raise DamagedEvidence(kept)
        return kept

    def reference_trials(
        self, seed: int, trials: Iterable[FrozenTrial] | None = None
    ) -> list[FrozenTrial]:
        """The finished float32 reference trials of ``seed`` among ``trials`` (the study's
        now, where not given), damaged ones too."""
        return [
            t
            for t in (self.trials((TrialState.COMPLETE,)) if trials is None else trials)
            if t.state == TrialState.COMPLETE
            and role_of(t) == ROLE_REFERENCE
            and (job := self.job(t)) is not None
            and job.seed == seed
        ]

    def reference_of(
        self, seed: int, trials: Iterable[FrozenTrial] | None = None
    ) -> Reference | None:
        """The float32 reference of ``seed``: the first of :meth:`reference_trials` whose
        record is sound; ``None`` if none has run, or every one is damaged (it runs
        again)."""
        for trial in self.reference_trials(seed, trials):
            try:
                return self.reference(trial)
            except DamagedEvidence:
                continue
        return None

    def damaged_references(self, seed: int) -> dict[int, str]:
        """The finished float32 references of ``seed`` whose record is damaged: trial
        number -> why."""
        damaged = {}
        for trial in self.reference_trials(seed):
            try:
                self.reference(trial)
            except DamagedEvidence as exc:
                damaged[trial.number] = str(exc)
        return damaged

    def _damaged(self, trial: FrozenTrial) -> str | None:
        """Why ``trial``'s evidence is damaged (``None``: it is sound)."""
        checked = self._checked(trial)
        return checked if isinstance(checked, str) else None

    def _checked(self, trial: FrozenTrial) -> Records | str:
        """``trial``'s records, read in its check, or why its evidence is damaged; checked
        once when it has finished, at each question while it may still change."""
        finished = trial.state.is_finished()
        if finished:
            kept = self._records.get(trial.number) or self._damage.get(trial.number)
            if kept is not None:
                return kept
        try:
            records, reference = checked_trial(trial)
        except DamagedEvidence as exc:
            if finished:
                self._damage[trial.number] = str(exc)
            return str(exc)
        if reference is not None:  # read in the check: kept, not read again
            self._references.setdefault(trial.number, reference)
        if finished:
            self._records[trial.number] = records
        return records


def reference_trial(study: optuna.Study, seed: int) -> FrozenTrial | None:
    """The finished float32 reference trial of ``seed``, if it has run (the first whose
    record is sound: one damaged is run again, :meth:`StudyView.damaged_references`)."""
    view = StudyView(study)
    for trial in view.reference_trials(seed):
        try:
            view.reference(trial)
        except DamagedEvidence:
            continue
        return trial
    return None


def reference_of(study: optuna.Study, seed: int) -> Reference | None:
    """The float32 reference of ``seed`` (:meth:`StudyView.reference_of`), read once."""
    return StudyView(study).reference_of(seed)
