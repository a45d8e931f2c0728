"""What a search found, as plain data: the evidence, the answer, and the judgements that follow
from them. Nothing here shows anything: the summary, the notes, the pictures and the YAML are
functions of it (:mod:`scalertune._review`), as Lightning's learning-rate finder keeps its
curve and its suggestion apart from ``plot()``.

:func:`~scalertune._judge._answer.judge` builds it from the study alone, so it is the same
after one worker, several workers or a crash: the search asks it what to run next, and
:class:`~scalertune.SearchResult` is this with the ways to show it. The rules that decide
live here, in :mod:`~scalertune._judge._answer` and in :mod:`~scalertune._judge._rank`: the
order of confirmation (:attr:`Findings.next_to_confirm`, by
:func:`~scalertune._judge._rank.next_to_confirm`), whether the best AMP config beats float32
(:func:`amp_wins`), and the config to train with (:func:`config_to_train`).
"""

from __future__ import annotations

import dataclasses
import math

import optuna

from scalertune import _policy
from scalertune._amp._config import DEFAULTS_BASELINES, AmpConfig
from scalertune._inrun._run_record import RunRecord, UnreadRecord
from scalertune._judge._horizon import RuledOut, finalists, holds
from scalertune._judge._outcome import Outcome
from scalertune._judge._phases import PhaseResult
from scalertune._judge._pruned import forward_overflow_modules, pruned_by_kind
from scalertune._judge._rank import confirmation_state, next_to_confirm
from scalertune._judge._reference import Reference
from scalertune._judge._settings import StudySettings
from scalertune._judge._speedup import Speedup
from scalertune._judge._target import Target
from scalertune._replay._trace import Trace
from scalertune._run._step_times import StepTimes
from scalertune._storage._names import ROLE_BASELINE


@dataclasses.dataclass(frozen=True)
class Findings:
    """The evidence of a search and its answer (see the module's docstring)."""

    study_name: str
    storage: str
    #: What the study was created with: the workload, the trial, the horizon, the space.
    settings: StudySettings
    #: float32 reference per seed that ran (the search's seed, then the confirmation seeds).
    references: dict[int, Reference]
    ranking: list[Outcome]
    #: Distinct configs that reached the target, in the order they are confirmed.
    candidates: list[Outcome]
    confirmations: dict[int, dict[int, Outcome]]
    #: Runs (of any role) that raised an error.
    failed: int
    #: The AMP run recommended; ``None`` when float32 is the answer (see :attr:`config`).
    recommended: Outcome | None
    #: float32 with the best AMP config's own clipping, when that differs from the
    #: workload's: what the clipping alone does, and the fair yardstick for the precision.
    float32_clip: Outcome | None = None
    #: The best AMP config that held for the horizon and was confirmed on every seed, whether
    #: or not it is faster than float32 on this device (the answer to use on a GPU when a CPU
    #: search recommends float32).
    best_amp: Outcome | None = None
    #: When float32 is the answer: ``float32_clip`` if clipping float32 that way reaches the
    #: target sooner and holds, else ``None`` (the workload's own float32).
    float32_choice: Outcome | None = None
    #: Every distinct config that reached the target, in the order they would be confirmed,
    #: before the horizon is taken into account (the finalists come from these).
    pool: list[Outcome] = dataclasses.field(default_factory=list)
    #: Run number -> how its branches did at the phases of the horizon.
    phases: dict[int, list[PhaseResult]] = dataclasses.field(default_factory=dict)
    #: precision (the dtype; float8's recipe too: ``_horizon.precision``) -> the run of it
    #: that fell behind float32, and what that rules out for the others of its precision
    #: (:class:`~scalertune._judge._horizon.RuledOut`).
    ruled: dict[str, RuledOut] = dataclasses.field(default_factory=dict)
    #: Runs with one module in float32 that a late phase proposed, trained from the start.
    islands: list[Outcome] = dataclasses.field(default_factory=list)
    #: float32's seed-to-seed spread of steps to the target: within it, steps tie.
    spread: float = 0.0
    #: Runs stopped by Ctrl-C or SIGTERM, or lost with a worker that died.
    lost: int = 0
    #: Runs whose evidence is missing after their retries (a checkpoint missing or damaged, a
    #: storage error): the first trial of each -> why. Never judged: a rerun completes them.
    missing: dict[int, str] = dataclasses.field(default_factory=dict)
    #: Runs whose stored evidence is damaged (:mod:`scalertune._judge._stored`): trial
    #: number -> why. Left out of every judgement; the search runs them again where it can.
    damaged: dict[int, str] = dataclasses.field(default_factory=dict)
    #: Training steps every run and the step timing executed (reused duplicates cost none).
    steps_trained: int = 0
    #: Sampled configs that had run already: their result was reused, nothing trained.
    reused: int = 0
    stop_reason: str | None = None
    interrupted: bool = False
    #: Whether the answer was chosen by hand (``report --trial N``), not by the search.
    by_hand: bool = False
    #: The real runs that loaded the answer and checked themselves, each its typed record
    #: (:class:`~scalertune._inrun._run_record.RunRecord`: its checks, actions and scaler; an
    #: :class:`~scalertune._inrun._run_record.UnreadRecord` where the study's copy is damaged),
    #: by run name, oldest first.
    runs: dict[str, RunRecord | UnreadRecord] = dataclasses.field(default_factory=dict)
    study: optuna.Study | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def deepspeed(self) -> bool:
        """Whether the workload trains in DeepSpeed's engine, under its own loss scaler."""
        return self.settings.deepspeed is not None

    @property
    def defaults(self) -> Outcome | None:
        """The baseline run of the framework's own defaults (PyTorch's, DeepSpeed's)."""
        return next((self.baselines[n] for n in DEFAULTS_BASELINES if n in self.baselines), None)

    @property
    def reference(self) -> Reference | None:
        """The float32 reference of the search's own seed; ``None`` before it ran.

        One typed record (:class:`~scalertune._judge._reference.Reference`), read by
        attribute: ``losses``, ``target_loss``, ``steps_to_target``, ``step_time_s``,
        ``step_times``, over a long horizon its ``windows`` by first step, and its gradient
        ``trace``.

        Example:
            >>> result.reference.steps_to_target  # doctest: +SKIP
            212
        """
        return self.references.get(self.settings.seed)

    @property
    def config(self) -> AmpConfig:
        """The config to train with: the recommended AMP config, or float32 (with the
        workload's own clipping, or with the best AMP config's where that reaches the target
        sooner and holds) when no AMP config is faster on this device."""
        return config_to_train(self)

    @property
    def target(self) -> Target | None:
        return self.reference.target if self.reference else None

    @property
    def step_times(self) -> StepTimes | None:
        return self.reference.step_times if self.reference else None

    @property
    def trace(self) -> Trace | None:
        """The float32 reference's gradient trace (``None`` for a study made before there
        was one)."""
        ref = self.reference
        if ref is None or ref.trace is None:
            return None
        return ref.trace.floored(self.settings.loss_floor)

    @property
    def run_equivalents(self) -> float:
        """The search's cost: its training steps over the horizon's (the float32 reference,
        which trains to the horizon once, is 1)."""
        return self.steps_trained / self.horizon if self.horizon else math.nan

    @property
    def reference_time_to_target(self) -> float:
        ref = self.reference
        seconds = None if ref is None else ref.time_to_target_s
        return math.nan if seconds is None else float(seconds)

    @property
    def speedup(self) -> Speedup | None:
        """float32's time to target over the best AMP config's, with its spread: steps to
        target on every seed it ran, times the interleaved step-time ratios."""
        return speedup(self, self.best_amp)

    @property
    def horizon(self) -> int:
        """The training steps the evidence covers."""
        return self.settings.horizon

    @property
    def long(self) -> bool:
        """Whether the horizon goes past a trial (the finalists were branched at its phases)."""
        return self.settings.long

    @property
    def windows(self) -> list[tuple[int, int]]:
        return self.settings.windows

    @property
    def finalists(self) -> list[Outcome]:
        """The candidates that may get evidence over the horizon, in the answer's order."""
        return finalists(self.pool, self.ranking, self.settings.clip_norm)

    def holds(self, outcome: Outcome) -> bool | None:
        """Whether ``outcome``'s config holds for the horizon.

        Args:
            outcome: A run of this search.

        Returns:
            True when it reached the target and held at every phase window (at once when the
            horizon is the trial); False when it did not reach the target, fell behind float32
            in a window, or is of a dtype another run ruled out (unless trained from step 0
            itself); ``None`` while a window's branch has not run.

        Example:
            >>> result.holds(result.ranking[0])  # doctest: +SKIP
            True
        """
        return holds(outcome, self.phases, self.windows, self.ruled)

    @property
    def baselines(self) -> dict[str, Outcome]:
        return {str(o.baseline): o for o in self.ranking if o.role == ROLE_BASELINE}

    def confirmation_state(self, candidate: Outcome) -> str:
        """Where a candidate's confirmation on other seeds stands.

        Args:
            candidate: One of :attr:`candidates`.

        Returns:
            ``"confirmed"``, ``"failed"`` (a seed that went non-finite or never reached its
            target), or ``"pending"`` (a seed not yet run).

        Example:
            >>> result.confirmation_state(result.candidates[0])  # doctest: +SKIP
            'confirmed'
        """
        return confirmation_state(
            self.confirmations, candidate, _policy.confirm_seeds(self.settings.seed)
        )

    @property
    def next_to_confirm(self) -> Outcome | None:
        """The candidate whose confirmation runs come next: the best one, and the next only
        once every one before it failed. ``None`` when one is confirmed or none is left."""
        return next_to_confirm(
            self.candidates, self.confirmations, _policy.confirm_seeds(self.settings.seed)
        )

    @property
    def pruned_by_kind(self) -> dict[str, int]:
        return pruned_by_kind(self.ranking)

    @property
    def forward_overflow_modules(self) -> list[str] | None:
        """``None`` unless *every* float16 run was pruned for a forward overflow; then where
        each overflowed (its culprit modules, as patterns), most frequent first (empty if
        none was named)."""
        return forward_overflow_modules(self.ranking)


def config_to_train(found: Findings) -> AmpConfig:
    """The recommended AMP config, else the float32 run chosen, else the workload's float32."""
    if found.recommended is not None:
        return found.recommended.config
    if found.float32_choice is not None:
        return found.float32_choice.config
    return found.settings.reference


def speedup(found: Findings, outcome: Outcome | None) -> Speedup | None:
    """float32's time to target over ``outcome``'s, with its spread: against float32 at the
    same clip where that ran (the steps a clip saves are not the precision's), else against
    the float32 reference of every seed ``outcome``'s config ran on."""
    times = found.step_times
    if outcome is None or times is None or outcome.config.dtype not in times:
        return None
    twin = found.float32_clip
    if (
        twin is not None
        and twin.steps_to_target is not None
        and outcome.steps_to_target is not None
        and twin.reached
        and outcome.reached
    ):
        ratios = [twin.steps_to_target / outcome.steps_to_target]
    else:
        runs = [outcome, *found.confirmations.get(outcome.number, {}).values()]
        ratios = [
            reached / o.steps_to_target
            for o in runs
            if o.seed in found.references
            and o.steps_to_target
            and o.reached
            and (reached := found.references[o.seed].steps_to_target)
        ]
    if not ratios:
        return None
    return Speedup.of(ratios, times.ratios(outcome.config.dtype))


def amp_wins(found: Findings, best: Outcome) -> bool:
    """Whether ``best`` reaches the target sooner than float32 on this device beyond the
    noise (a tie goes to float32: the simpler config)."""
    faster = speedup(found, best)
    return faster is not None and faster.low > 1
