"""The terminal summary: float32, the baselines, the best trials, the phases of the horizon,
what the scaler will do over it, what was pruned, the answer and its verdict."""

from __future__ import annotations

import math
import statistics
import textwrap
from typing import Any

from scalertune._amp._check import CHECK_EVERY
from scalertune._judge._findings import Findings
from scalertune._judge._outcome import Outcome
from scalertune._judge._phases import PhaseResult
from scalertune._judge._rank import all_tied
from scalertune._judge._reference import same_on_every_seed, unseeded_note
from scalertune._judge._speedup import EMULATED, emulated
from scalertune._review._describe import (
    describe_outcome,
    evidence_of,
    forecast_line,
    overflow_hint,
    unjudged,
    why_not,
)
from scalertune._review._runs import runs_lines
from scalertune._review._scaler_advice import (
    article_fix_line,
    replay_agreement,
    scaler_advice,
)
from scalertune._review._verdict import verdict
from scalertune._run._record import PRUNE_KINDS
from scalertune._run._step_times import StepTimes, spread
from scalertune._storage._names import ROLE_BASELINE, ROLE_SEARCH
from scalertune._storage._trial_record import Job
from scalertune._text import format_table, plural

_COLUMNS = (
    "run",
    "config",
    "skipped",
    "min scale",
    "steps to target",
    "ms/step",
    "time to target",
    "loss/fp32 @step",
    "steps run",
)
_INTERRUPTED = "Interrupted: every finished trial is kept; rerun the same command to resume."
#: The summary's paragraphs (the verdict) are wrapped to this width.
_WIDTH = 100


def summary(result: Findings, *, top: int = 5) -> str:
    """The table printed at the end of a search (and by ``scalertune report``): ``top``
    sampled trials beside the references, the baselines and the runs of other roles."""
    lines = _head(result)
    if result.reference is None or result.target is None:
        lines.append(
            "  no sound float32 reference: nothing to compare with (damaged evidence below: "
            "the same search run again trains the reference it lacks)."
            if result.damaged
            else "  no float32 reference yet: nothing to compare with."
        )
        lines += _damaged(result)
        return "\n".join(lines)
    lines += ["", *format_table(_rows(result, top)), ""]
    phases = _phases(result) if result.long else []
    if phases:  # no finalist (none reached the target): no table of none
        lines += [*phases, ""]
    lines += _notes(result)
    lines += ["", *_answer(result)]
    if result.runs:
        lines += ["", *runs_lines(result.runs)]
    return "\n".join(lines)


def _head(result: Findings) -> list[str]:
    s = result.settings
    horizon = f", horizon {result.horizon} steps" if result.long else ""
    lines = [
        f"scalertune study {result.study_name!r}"
        + (f" in {result.storage}" if result.storage else "")
    ]
    if not s.stored:
        return [*lines, "  no settings stored: not a study of scalertune search"]
    ranks = f", {s.nproc_per_node} ranks per run" if s.nproc_per_node > 1 else ""
    if s.nnodes > 1:
        ranks = (
            f", {s.nnodes * s.nproc_per_node} ranks per run "
            f"({s.nnodes} hosts x {s.nproc_per_node}: {', '.join(s.hosts)})"
        )
    lines.append(
        f"  workload {s.factory}, {s.steps} steps per trial{horizon}, seed {s.seed}, "
        f"space {s.space_name!r}, on {s.device}{ranks}"
    )
    target = result.target
    if target is None:
        return lines
    final = (
        f"float32 is at {target.reference_final:.4g} by step {s.steps}"
        if result.long
        else f"float32 ends at {target.reference_final:.4g}"
    )
    lines.append(
        f"  float32 target loss {target.loss:.4g} ({final}, from {target.reference_start:.4g})"
    )
    reached = [(seed, r.steps_to_target) for seed, r in sorted(result.references.items())]
    if len(reached) > 1:
        lines.append(
            "  float32 reaches its own target at steps "
            + ", ".join(str(steps) for _, steps in reached)
            + f" on seeds {', '.join(str(seed) for seed, _ in reached)}: within a dtype, "
            + (  # the spread as the Tied line says it
                f"fewer steps by less than {100 * result.spread:.2g}% of the horizon "
                f"({result.spread * result.horizon:.0f} steps) is a tie"
                if result.long
                else f"up to {100 * result.spread:.2g}% more steps is a tie"
            )
        )
        curves = [r.losses for _, r in sorted(result.references.items())]
        if same_on_every_seed(curves):
            lines.append("  " + unseeded_note([seed for seed, _ in reached]))
    times = result.step_times
    if times is not None:
        lines.append(
            "  step time, interleaved: "
            + ", ".join(
                f"{d} {times.median(d) * 1e3:.3g} ms" + _speed_words(result, d, times)
                for d in times.rounds
            )
        )
        if times.busy:
            what = (  # one thread already: the load is other processes'
                "time on a quiet machine"
                if times.threads == 1
                else "set OMP_NUM_THREADS=1, or time on a quiet machine"
            )
            lines.append(
                f"  the CPU was busy while timing (load {times.load:.2g} per core): the step "
                f"times, and their ratios, may be far off; {what}"
            )
    return lines


def _speed_words(result: Findings, dtype: str, times: StepTimes) -> str:
    if dtype == "float32":
        return ""
    if dtype == "float8" and emulated(result.settings.device):
        return f" ({EMULATED})"
    return f" ({_spread(times.ratios(dtype))} float32's)"


def _rows(result: Findings, top: int) -> list[tuple[str, ...]]:
    ref = result.reference
    rows: list[tuple[str, ...]] = [_COLUMNS]
    rows.append(
        (
            "float32 reference",
            _describe_reference(result.settings.clip_norm),
            "-",
            "-",
            _int(None if ref is None else ref.steps_to_target),
            _ms(None if ref is None else ref.step_time_s),
            _sec(result.reference_time_to_target),
            "1",
            _int(None if ref is None else ref.steps_run),
        )
    )
    if result.float32_clip is not None:
        rows.append(_row(result.float32_clip.label, result.float32_clip))
    for name, outcome in result.baselines.items():
        rows.append(_row(name, outcome))
    # the runs that reached the target in the order they were judged (a tie goes to the more
    # stable, then the simpler config, as the summary's Tied line says), then the others
    judged = {o.number: i for i, o in enumerate(result.pool)}
    searched = sorted(
        (o for o in result.ranking if o.role == ROLE_SEARCH and o.state == "complete"),
        key=lambda o: judged.get(o.number, len(judged)),
    )
    others = [o for o in result.ranking if o.role not in (ROLE_SEARCH, ROLE_BASELINE)]
    for outcome in [*others, *searched[:top]]:
        rows.append(_row(outcome.label, outcome))
    return rows


def _phases(result: Findings) -> list[str]:
    """Each finalist's branches, window by window: its loss over float32's there."""
    windows = result.windows
    rows: list[tuple[str, ...]] = [
        ("phases of the horizon", "config", *(f"{a}-{b}" for a, b in windows), "holds")
    ]
    runs = {
        run.number: run  # an island that reached the target is a finalist too: one row
        for run in [
            *result.finalists,
            *result.islands,
            *([result.float32_clip] if result.float32_clip else []),
        ]
    }
    for run in runs.values():
        done = {p.start: p for p in result.phases.get(run.number, [])}
        cells = [_phase_cell(done.get(a)) for a, _ in windows]
        verdict = result.holds(run)
        rows.append(
            (
                run.label,
                run.config.describe(),
                *cells,
                {True: "yes", False: "no", None: unjudged(result)}[verdict],
            )
        )
    if len(rows) == 1:
        return []
    judged = {run.number: run for run in [*result.finalists, *result.islands]}
    notes = [
        f"{run.label}: {why_not(result, run)}"
        for run in judged.values()
        if result.holds(run) is False
    ]
    return [*format_table(rows), *notes]


def _phase_cell(phase: PhaseResult | None) -> str:
    if phase is None:
        return "-"
    return (
        "non-finite"
        if phase.nonfinite
        else f"{phase.ratio:.3g}x" + (" behind" if phase.behind else "")
    )


def _notes(result: Findings) -> list[str]:
    lines = [f"{name}: {describe_outcome(outcome)}" for name, outcome in result.baselines.items()]
    lines.append(_counts(result))
    broken = [f"{plural(result.failed, 'run')} raised an error"] if result.failed else []
    if result.lost:
        broken.append(
            f"{plural(result.lost, 'run')} interrupted or lost with "
            f"{'its' if result.lost == 1 else 'their'} worker"
        )
    if broken:
        why = " (each trial's error attribute says why)" if result.failed else ""
        lines.append(f"Failed: {'; '.join(broken)}{why}")
    for number, why in sorted(result.missing.items()):
        lines.append(
            f"Missing evidence: trial #{number} ({_job(result, number)}): {why}; "
            "rerun the same command to complete it"
        )
    lines += _damaged(result)
    if result.stop_reason:
        lines.append(f"Sampling stopped early: {result.stop_reason}")
    lines += [
        text
        for text in (
            _all_tied(result),
            scaler_advice(result),
            article_fix_line(result),
            replay_agreement(result),
            overflow_hint(result),
            forecast_line(result),
        )
        if text
    ]
    return lines


def _damaged(result: Findings) -> list[str]:
    """One line for each run whose stored evidence is damaged: left out of the judgement (a
    search runs it again where it can: a float32 reference, a once-per-study run)."""
    return [f"Damaged evidence, left out: {why}" for _, why in sorted(result.damaged.items())]


def _job(result: Findings, number: int) -> str:
    """What the run of trial ``number`` was for, in a few words."""
    if result.study is None:
        return "run"
    job = Job.partial(result.study.trials[number])
    role = job.role or "run"
    if job.of is not None:
        return f"{role} of trial #{job.of}, steps {job.start}-{job.end}"
    return role


def _all_tied(result: Findings) -> str | None:
    """One line where every config that reached the target ties with every other."""
    noise = result.settings.noise(result.spread)
    if not all_tied(result.pool, result.step_times, noise):
        return None
    return (
        f"Tied: the {len(result.pool)} configs that reached the target are as fast as "
        f"each other within the noise (float32's seed-to-seed spread of "
        f"{100 * noise.spread:.2g}% in steps"
        + (" of the horizon" if noise.horizon else "")
        + ", and the step-time spread): the comparison cannot tell them apart at this "
        "horizon, so the order is the more stable, then the simpler config"
    )


def _counts(result: Findings) -> str:
    searched = [o for o in result.ranking if o.role == ROLE_SEARCH]
    pruned: dict[str, int] = {}
    for o in searched:
        if o.state == "pruned":
            pruned[o.prune_kind or "unknown"] = pruned.get(o.prune_kind or "unknown", 0) + 1
    counted = ", ".join(f"{n} {PRUNE_KINDS.get(k, k)}" for k, n in sorted(pruned.items()))
    return (
        f"{plural(len(searched), 'sampled trial')} finished; pruned {sum(pruned.values())}"
        + (f" ({counted})" if counted else "")
        + (f"; {result.reused} reused an earlier run of the same config" if result.reused else "")
    )


def _answer(result: Findings) -> list[str]:
    rec, best = result.recommended, result.best_amp
    if result.interrupted and best is None and rec is None:
        return [
            f"Recommended: pending: the search was interrupted before {_pending(result)}",
            f"Cost so far: {_cost(result)}",
            _INTERRUPTED,
        ]
    lines = []
    if rec is not None:
        lines.append(f"Recommended: {rec.label} [{rec.config.describe()}]")
        lines.append(f"  {_confirmed(result, rec)}")
    else:
        lines.append(f"Recommended: {result.config.describe()} (no autocast, no scaler)")
        if best is not None:
            lines.append(
                f"  best AMP config that holds: {best.label} [{best.config.describe()}]"
                f", {_confirmed(result, best)}"
            )
    ahead = result.candidates.index(best) if best in result.candidates else len(result.candidates)
    for candidate in result.candidates[:ahead]:
        lines.append(
            f"  not confirmed: {candidate.label} [{candidate.config.describe()}] "
            f"{_confirm_failure(result, candidate)}"
        )
    lines += textwrap.wrap(f"Verdict: {verdict(result)}", _WIDTH, subsequent_indent="  ")
    lines.append(f"Cost: {_cost(result)}")
    if not result.long:
        lines += textwrap.wrap(_past_the_trials(result), _WIDTH, subsequent_indent="  ")
    if result.interrupted:
        lines.append(_INTERRUPTED)
    return lines


def _past_the_trials(result: Findings) -> str:
    """The path from a short search: the run checks itself past the evidence's end."""
    steps = result.horizon
    if result.settings.deepspeed is not None:  # no in-run check in DeepSpeed's engine
        return (
            f"Past step {steps}: a run in DeepSpeed's engine has no in-run check (the engine "
            "casts the model itself, so a float32 forward at its weights is no float32 "
            "check); --horizon N (your training's steps) gives evidence over N steps before "
            "training, for about 3 trainings of N"
        )
    return (
        f"Past step {steps}: a run that loads this answer (scalertune.load, scalertune.attach) "
        f"checks itself against float32 every {CHECK_EVERY} steps and acts when the precision "
        f"or the scaler fails late; --horizon N (your training's steps) gives evidence over N "
        "steps before training, for about 3 trainings of N"
    )


def _pending(result: Findings) -> str:
    if result.long and any(result.holds(f) is None for f in result.finalists):
        return "its finalists had their evidence over the horizon"
    return "its best candidate was confirmed on the other seeds"


def _confirmed(result: Findings, run: Outcome) -> str:
    seeds = sorted(result.confirmations.get(run.number, {}))
    holds = f"; {evidence_of(result, run)}" if result.long else ""
    return (
        f"confirmed on seeds {', '.join(map(str, [run.seed, *seeds]))}: "
        f"{describe_outcome(run)}{holds}"
    )


def _cost(result: Findings) -> str:
    return (
        f"{result.run_equivalents:.1f} run-equivalents of the horizon "
        f"({result.steps_trained} training steps over all runs and the step timing, "
        f"over {result.horizon})"
    )


def _confirm_failure(result: Findings, candidate: Outcome) -> str:
    runs = result.confirmations.get(candidate.number, {})
    bad = [f"seed {s}: {describe_outcome(o)}" for s, o in sorted(runs.items()) if not o.reached]
    return "; ".join(bad) if bad else "(confirmation incomplete)"


def _row(label: str, o: Outcome) -> tuple[str, ...]:
    a = o.figures
    if o.state == "pruned":
        kind = o.prune_kind or "pruned"
        timed = kind in ("slower", "behind", "float8")  # pruned where it stopped, all finite
        step = a.steps_run if timed else a.first_nonfinite_step
        where = step if step is not None else "?"
        reached = f"{kind if timed else 'pruned'}@{where}"
    else:
        reached = _int(a.steps_to_target)
    ratio = a.loss_vs_float32
    at = "-" if ratio is None else f"{float(ratio):.3g} @{a.loss_vs_float32_step}"
    scale = _g(a.min_scale) if o.config.uses_scaler else "-"
    return (
        label,
        o.config.describe(),
        _int(a.skipped_steps),
        scale,
        reached,
        _ms(a.step_time_s),
        _sec(o.time_to_target if o.reached else math.nan),
        at,
        _int(a.steps_run),
    )


def _spread(ratios: list[float]) -> str:
    low, high = spread(ratios)
    return f"{statistics.median(ratios):.2f}x, {low:.2f}-{high:.2f}x"


def _describe_reference(clip: float | None) -> str:
    return "float32" + (f", clip {clip:.3g} (the workload's)" if clip else "")


def _int(v: Any) -> str:
    return "never" if v is None else str(int(v))


def _g(v: Any) -> str:
    return "-" if v is None else f"{float(v):.3g}"


def _ms(v: Any) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v * 1e3:.3g}"


def _sec(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:.3g}s"
