"""Each trial's note in optuna-dashboard: what the run is (its role), what happened, and where
its evidence is.

The dashboard puts a trial's note at the top of the trial's page, above the attributes, so
the note says in words what the attributes hold in figures: for a run, how it trained and,
over a long horizon, how its branches did; for a branch (role ``phase``), where it was
branched from, how it did against float32 over its window and which trials to select to see
float32's continuation beside it; for the recommendation, a mark and its picture.
"""

from __future__ import annotations

from typing import Any

from optuna.trial import FrozenTrial, TrialState

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._errors import DamagedEvidence
from scalertune._judge._findings import Findings
from scalertune._judge._horizon import behind_from, is_from_start, phases_of
from scalertune._judge._outcome import Outcome
from scalertune._judge._phases import PhaseResult
from scalertune._judge._reference import Reference
from scalertune._judge._stored import sound
from scalertune._review._artifacts import Pictures
from scalertune._review._describe import describe_outcome, why_not
from scalertune._review._verdict import verdict
from scalertune._storage._names import (
    ROLE_BASELINE,
    ROLE_CONFIRM,
    ROLE_FLOAT32_CLIP,
    ROLE_ISLAND,
    ROLE_PHASE,
    ROLE_RECOMMENDED,
    ROLE_REFERENCE,
    ROLE_REPLAY,
    ROLE_SEARCH,
)
from scalertune._storage._optuna import study_id
from scalertune._text import readable

#: What each value of a trial's ``role`` attribute means, as the study note lists them.
ROLES = {
    ROLE_REFERENCE: "float32, no autocast, no scaler: its final smoothed loss plus "
    f"{_policy.TARGET_TOLERANCE:.0%} is the target of every run on its seed; "
    "over a long horizon it trains to the horizon once, keeping checkpoints "
    "for the branches; the yardstick, not a candidate",
    ROLE_BASELINE: "`pytorch-default` (PyTorch's defaults) and `init-scale-4096` (the usual "
    "manual fix), and where the space tries float8 `torchao-default` (torchao's default "
    "recipe, tensorwise), run once per study",
    ROLE_SEARCH: "a config the sampler chose",
    ROLE_CONFIRM: "one of the best configs rerun on another seed, judged against that "
    "seed's own float32 reference",
    ROLE_FLOAT32_CLIP: "float32 clipped as the best AMP config is, when that differs from the "
    "workload's own clipping: what the clipping alone does, so that the "
    "verdict credits the precision only with its own gain",
    ROLE_PHASE: "a finalist (`of`) branched from the float32 reference's checkpoint at the "
    "first step of a phase window of the horizon (`start`-`end`), trained over "
    "the window and compared with float32's own continuation over the same "
    "steps, or (`start` 0) trained from step 0 and judged at every window it "
    "reached; evidence, not a candidate",
    ROLE_ISLAND: "a finalist (`island_of`) with one module kept in float32, proposed where "
    "a late phase found that module's precision limiting the fit; trained from "
    "the start and branched at the phases like the finalists",
    ROLE_REPLAY: "the float16 scaler setting the replay of float32's gradients found best "
    "over the horizon, trained to check it",
    ROLE_RECOMMENDED: "the study's answer: one more trial with the recommended config (float32 "
    "when no AMP config is faster here), added once the runs it rests on "
    "finished; it carries the curve, figures and time to target of the run "
    "it repeats (`recommends`), and `scalertune dashboard` shows it as the "
    "Best Trial",
}


def is_recommended(trial: FrozenTrial, result: Findings) -> bool:
    """Whether ``trial`` is the answer: the run of the recommended config (float32 at the best
    AMP config's clip, or the float32 reference, when float32 is the answer), or the
    ``recommended`` trial that repeats it."""
    if trial.user_attrs.get("role") == ROLE_RECOMMENDED:
        return trial.user_attrs.get("config") == result.config.to_dict()
    chosen = result.recommended or result.float32_choice
    if chosen is not None:
        return trial.number == chosen.number
    return result.reference is not None and trial.number == result.reference.trial


def trial_note(
    trial: FrozenTrial, result: Findings, pictures: Pictures | None = None
) -> str | None:
    """What a trial is and what happened to it, in words; ``None`` while it runs."""
    if trial.state in (TrialState.RUNNING, TrialState.WAITING):
        return None
    if trial.number in result.damaged:
        why = result.damaged[trial.number]
        return f"### Trial {trial.number}: damaged evidence\n\n{why}: left out.\n"
    attrs = trial.user_attrs
    role = attrs.get("role")
    lines = [f"### Trial {trial.number}: {_mark(trial, result)}{_title(trial, result)}", ""]
    if role in ROLES:
        lines += [f"*{role}*: {ROLES[role]}.", ""]
    config = attrs.get("config")
    if isinstance(config, dict):
        lines += [f"Config: `{AmpConfig.from_dict(config).describe()}`", ""]
    if role == ROLE_PHASE and trial.state != TrialState.FAIL:
        lines += branch_lines(trial, result)
    else:
        lines += _what_happened(trial, result)
        lines += _over_the_horizon(trial, result)
    if is_recommended(trial, result):
        lines += [_confirmed(result), ""]
    if trial.intermediate_values:
        lines += [_curve_line(trial), ""]
    url = (pictures.trials if pictures else {}).get(trial.number)
    if url:
        lines += [
            f"![trial {trial.number}: loss over the float32 target"
            f"{', and loss scale' if _uses_scaler(config) else ''}]({url})",
            "",
        ]
    return "\n".join(lines)


def _title(trial: FrozenTrial, result: Findings) -> str:
    attrs = trial.user_attrs
    role = attrs.get("role")
    return {
        ROLE_REFERENCE: f"float32 reference, seed {attrs.get('seed')}",
        ROLE_BASELINE: f"baseline `{attrs.get('baseline')}`",
        ROLE_SEARCH: "search trial",
        ROLE_CONFIRM: f"confirmation of trial {attrs.get('confirms')} on seed {attrs.get('seed')}",
        ROLE_FLOAT32_CLIP: f"float32 with trial {attrs.get('clip_of')}'s clipping",
        ROLE_PHASE: (
            f"trial {attrs.get('of')}'s config from step 0 to {attrs.get('end')}"
            if is_from_start(attrs)
            else f"branch of trial {attrs.get('of')} at steps {attrs.get('start')}-"
            f"{attrs.get('end')}"
        ),
        ROLE_ISLAND: f"island of trial {attrs.get('island_of')}",
        ROLE_REPLAY: "the replay's scaler setting",
        ROLE_RECOMMENDED: (
            "the recommendation" if is_recommended(trial, result) else "an earlier recommendation"
        ),
    }.get(str(role), str(role or "no role recorded"))


def _mark(trial: FrozenTrial, result: Findings) -> str:
    if is_recommended(trial, result):
        return "★ " if trial.user_attrs.get("role") == ROLE_RECOMMENDED else "★ recommended, "
    best = result.best_amp
    if result.recommended is None and best is not None and trial.number == best.number:
        return "☆ best AMP config that holds (for a GPU), "
    return ""


def _confirmed(result: Findings) -> str:
    rec = result.recommended
    if rec is None:
        return f"**Recommended**: {result.config.describe()}. {_sentence(verdict(result))}."
    confirmations = sorted(result.confirmations.get(rec.number, {}).items())
    seeds = [rec.seed, *(seed for seed, _ in confirmations)]
    reruns = ", ".join(str(o.number) for _, o in confirmations)
    return (
        f"**Recommended**: trial {rec.number}'s config, confirmed on seeds "
        f"{', '.join(map(str, seeds))}" + (f" (trials {reruns})" if reruns else "") + "."
    )


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _uses_scaler(config: Any) -> bool:
    return isinstance(config, dict) and config.get("dtype") == "float16"


def _curve_line(trial: FrozenTrial) -> str:
    attrs, steps = trial.user_attrs, sorted(trial.intermediate_values)
    # a long run's curve is thinned: say the spacing it has
    every = steps[1] - steps[0] if len(steps) > 1 else _policy.READBACK_INTERVAL
    where = (
        f", at the absolute steps of its window ({steps[0]}-{steps[-1]})"
        if attrs.get("role") == ROLE_PHASE
        else ""
    )
    return (
        f"Curve (intermediate values): log10 of the smoothed loss over seed "
        f"{attrs.get('seed')}'s float32 target, one point per {every} steps{where}; 0 is "
        "the target, 1 ten times above it."
    )


def _what_happened(trial: FrozenTrial, result: Findings) -> list[str]:
    attrs = trial.user_attrs
    if trial.state == TrialState.FAIL:
        error = attrs.get("error") or "no error recorded (its worker died)"
        return [
            f"**Failed**: `{error}`",
            "",
            "The error came from the workload's code under this config; the search moved on.",
            "",
        ]
    if attrs.get("role") == ROLE_RECOMMENDED:
        return _recommended_lines(trial, result)
    if attrs.get("role") == ROLE_REFERENCE:
        return _reference_lines(trial)
    if "config" not in attrs:
        return []
    outcome = Outcome.from_trial(trial)
    if outcome.state == "pruned":
        return [
            f"**Pruned: {attrs.get('pruned_because')}**, after {attrs.get('steps_run')} steps",
            "",
            f"{outcome.prune_reason}",
            "",
            "A pruned trial has no objective value: its curve ends where it was "
            "pruned, and the History plot leaves it out.",
            "",
        ]
    lines = [f"**Outcome**: {describe_outcome(outcome)}.", ""]
    if attrs.get("duplicate_of") is not None:
        lines += [
            f"The same config as trial {attrs['duplicate_of']}: its result is reused, "
            "nothing was trained again.",
            "",
        ]
    if not outcome.reached:
        lines += [
            "**Infeasible** in the dashboard: a run that never reaches the float32 "
            "target breaks the constraint `target_gap` <= 0, so it is never the best "
            "trial.",
            "",
        ]
    return lines + _figures(attrs)


def _reference_lines(trial: FrozenTrial) -> list[str]:
    try:
        ref = Reference.from_trial(trial)
    except DamagedEvidence as exc:  # left out of the judgement, and run again
        return [f"**Damaged**: {exc}.", ""]
    return [
        f"Target loss {as_g(ref.target_loss)}, reached after {ref.steps_to_target} steps "
        f"at {as_ms(ref.step_time_s)} per step; trained {ref.steps_run} steps.",
        "",
    ]


def _recommended_lines(trial: FrozenTrial, result: Findings) -> list[str]:
    attrs = trial.user_attrs
    if not is_recommended(trial, result):
        return [
            "The answer before later trials changed it; the note of the study names "
            "the current one.",
            "",
        ]
    source = attrs.get("recommends")
    repeats = (
        f"the float32 reference, trial {attrs.get('reference_trial')}"
        if source == "float32"
        else f"trial {source}"
    )
    return [
        f"The study's answer, added once the runs it rests on finished. It repeats "
        f"{repeats}: its curve and figures are that run's, and its value is that run's "
        "time to target as the summary prints it. `scalertune dashboard` shows it as the "
        "Best Trial, even where a faster run (one that did not hold, or was not "
        "confirmed) has a smaller value.",
        "",
        *_figures(attrs),
    ]


def _figures(attrs: dict[str, Any]) -> list[str]:
    figures = [
        f"{label} {shown}"
        for label, shown in (
            ("time to target", as_s(attrs.get("time_to_target_s"))),
            ("step time", as_ms(attrs.get("step_time_s"))),
            ("skipped steps", attrs.get("skipped_steps")),
            (
                "loss scale down to",
                as_g(attrs.get("min_scale")) if _uses_scaler(attrs.get("config")) else None,
            ),
            ("final loss / float32's", as_g(attrs.get("loss_vs_float32"))),
        )
        if shown is not None
    ]
    return ["; ".join(figures) + ".", ""] if figures else []


def _over_the_horizon(trial: FrozenTrial, result: Findings) -> list[str]:
    """A branched run's verdict over the horizon, with its branches' trial numbers."""
    done = result.phases.get(trial.number)
    if not done or trial.user_attrs.get("role") == ROLE_RECOMMENDED:
        return []
    numbers = branch_numbers(result)
    cells = ", ".join(
        f"{p.describe()} (trial {numbers.get((trial.number, p.start), '?')})" for p in done
    )
    holds = result.holds(Outcome.from_trial(trial))
    verdict = {
        True: "**Holds for the horizon**",
        False: "**Does not hold for the horizon**",
        None: "**Over the horizon** (branches pending)",
    }[holds]
    said = f"{verdict}: its loss over float32's in each phase window, {cells}."
    return [
        said + (f" It {why_not(result, Outcome.from_trial(trial))}." if holds is False else ""),
        "",
    ]


def branch_numbers(result: Findings) -> dict[tuple[int, int], int]:
    """(run number, window start) -> the trial number of its finished branch (the last one,
    where a branch was retried)."""
    if result.study is None:
        return {}
    out: dict[tuple[int, int], int] = {}
    for t in result.study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)
    ):
        attrs = t.user_attrs
        if attrs.get("role") != ROLE_PHASE:
            continue
        of = int(attrs["of"])
        if is_from_start(attrs):  # one run from step 0 judged at every window it reached
            for p in phases_of(sound([t])[0]).get(of, []):
                out[of, p.start] = t.number
        else:
            out.setdefault((of, int(attrs["start"])), t.number)
    return out


def branch_lines(trial: FrozenTrial, result: Findings) -> list[str]:
    """A branch's note: what it is, how it did against float32, and where float32's own
    continuation over the same steps is."""
    attrs = trial.user_attrs
    start, end, of = int(attrs["start"]), int(attrs["end"]), attrs.get("of")
    ref = result.references.get(int(attrs.get("seed", 0)))
    ref_trial = None if ref is None else ref.trial
    scale = attrs.get("initial_scale")
    scaler = (
        f"; its loss scaler started at {as_g(scale)} (`initial_scale`: where the replay "
        f"of this config over float32's gradients puts it by step {start}, not at "
        "`init_scale`, whose start-up back-offs a real run would have left behind)"
        if _uses_scaler(attrs.get("config")) and scale is not None
        else ""
    )
    if is_from_start(attrs):
        judged = phases_of(sound([trial])[0]).get(int(of), []) if of is not None else []
        return [
            f"**What it is**: trial {of}'s config trained from step 0 to step {end} on "
            "the batches float32 trained on, its scaler from `init_scale`, as your run "
            "will be (a branch shows whether a config can follow float32 from float32's "
            "weights; this run shows whether it gets there). It is judged at each phase "
            f"window it reached against float32's losses at the same steps: "
            f"{behind_from(judged)}.",
            "",
            *([_branch_verdict(judged[-1]), ""] if judged else []),
            _continuation(trial, result, ref_trial),
            "",
        ]
    lines = [
        f"**What it is**: trial {of}'s config, branched from the float32 reference's "
        f"checkpoint at step {start} (trial {'?' if ref is None else ref.trial}: the weights, "
        "optimizer and scheduler state, data position and random state float32 had "
        f"there), trained for steps {start}-{end} on the batches float32 trained on"
        f"{scaler}.",
        "",
    ]
    judged = phases_of(sound([trial])[0]).get(int(of), []) if of is not None else []
    if judged:
        lines += [_branch_verdict(judged[0]), ""]
    lines += [_continuation(trial, result, ref_trial), ""]
    return lines


def _branch_verdict(phase: PhaseResult) -> str:
    half = phase.start + (phase.end - phase.start) // 2
    rule = (
        f"A branch falls behind when its loss is more than {_policy.PHASE_TOLERANCE:.0%} "
        f"above float32's and more than {_policy.PHASE_Z:g} standard errors of the paired "
        f"difference; it goes non-finite when more than "
        f"{_policy.PHASE_NONFINITE_SHARE:.0%} of its losses are inf/NaN or it was pruned."
    )
    if phase.nonfinite:
        return f"**Non-finite** over steps {phase.start}-{phase.end}. {rule}"
    said = "**Holds**" if phase.holds else "**Falls behind float32**"
    return (
        f"{said}: its loss is {readable(phase.ratio):g}x float32's over steps {half}-"
        f"{phase.end}, the window's last half, paired step by step ({readable(phase.z):g} "
        f"standard errors of the difference). {rule}"
    )


def _continuation(trial: FrozenTrial, result: Findings, reference: int | None) -> str:
    start, end = trial.user_attrs.get("start"), trial.user_attrs.get("end")
    if reference is None:
        return "float32's continuation: its reference trial is not in this study."
    pages = ""
    if result.study is not None:
        sid = study_id(result.study)
        pages = (
            f" [Trials {reference} and {trial.number}](/dashboard/studies/{sid}/trials"
            f"?numbers={reference},{trial.number}) shows their pages side by side."
        )
    # optuna-dashboard draws every trial's curve in one plot, each a legend entry that
    # Plotly toggles: isolating two is how one selects them there
    return (
        f"**float32's continuation** over steps {start}-{end} is the reference's own "
        f"curve, trial {reference}: its intermediate values cover the whole horizon, "
        "against the same target. The study page's Intermediate values plot draws the "
        f"trials on one axis: in its legend, double-click `trial #{reference}` (it alone "
        f"stays), then click `trial #{trial.number}`, to see this branch beside float32 "
        f"at steps {start}-{end}.{pages}"
    )


def as_g(value: Any) -> str | None:
    """A figure rounded for reading (``None`` stays ``None``)."""
    return None if value is None else f"{readable(float(value)):g}"


def as_s(value: Any) -> str | None:
    return None if value is None else f"{readable(float(value)):g} s"


def as_ms(value: Any) -> str | None:
    return None if value is None else f"{readable(float(value) * 1e3):g} ms"
