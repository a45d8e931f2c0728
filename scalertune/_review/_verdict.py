"""The verdict of a search: the best AMP config against float32 on this device, and why.

The answer is the config that holds for the horizon and is fastest **on this device**,
float32 included: float32's time to the target against the best AMP config's (their steps
to target on every seed, times the interleaved step-time ratios, with the spread of both).
When the best AMP config clips otherwise than the workload, float32 clipped the same way is
the comparison (a clip can halve the steps to the target whatever the dtype, and that gain
is the clip's). AMP is the answer only when it is faster beyond that spread; when it is as
fast within the noise, or slower (CPUs without native half-precision matmul), float32 is, and
the best AMP config that held is still carried (``evidence.best_amp``), to use on a GPU.
"""

from __future__ import annotations

import math

from scalertune._judge._findings import Findings, speedup
from scalertune._judge._horizon import fewer_steps
from scalertune._judge._outcome import Outcome
from scalertune._judge._pruned import pruned_by_kind
from scalertune._judge._speedup import CPU_SLOWER, emulated
from scalertune._review._describe import describe_outcome, why_not
from scalertune._run._record import PRUNE_KINDS
from scalertune._text import plural


def verdict(result: Findings) -> str:
    """The one-paragraph answer the summary, the YAML and the dashboard carry."""
    device = result.settings.device
    best = result.best_amp
    covers = _covers(result)
    if best is None:
        return f"{_no_amp(result)}; keep training in float32 on {device}{covers}"
    if result.by_hand:
        return _by_hand(result, best) + covers
    found = speedup(result, best)
    if found is None:
        return f"speed against float32 unknown on {device} (no step timing){covers}"
    said = found.verdict(device)
    clause = _clipping_clause(result)
    if best.config.float8 and emulated(device):
        return (
            f"train in {result.config.describe()}: the best AMP config that holds, "
            f"{best.label} [{best.config.describe()}], ran float8 emulated on {device}: "
            "torchao computes float8's numerics there without float8 matmuls, so no speed is "
            f"claimed for it{clause}; on a GPU with float8 matmuls (CUDA capability 8.9+), use "
            f"it (evidence.best_amp) or run the search there{covers}"
        )
    if result.recommended is None:
        why = CPU_SLOWER if found.cpu_note(device) else "A tie goes to the simpler config"
        return (
            f"train in {result.config.describe()}: the best AMP config that holds, "
            f"{best.label} [{best.config.describe()}], is "
            f"{found.verdict(device, note=False)}{clause}. {why}: on a GPU, use it "
            f"(evidence.best_amp) or run the search there{covers}"
        )
    return said + clause + covers


def _by_hand(result: Findings, chosen: Outcome) -> str:
    """The verdict of an answer chosen by hand (``report --trial N``): what that run did, and
    its speed where one is claimed; never that it is the search's choice."""
    device = result.settings.device
    seeds = result.confirmations.get(chosen.number, {})
    said = (
        f"train in {chosen.config.describe()}: {chosen.label}, chosen by hand (report --trial "
        f"{chosen.number}), not the search's answer: {describe_outcome(chosen)}"
        + (
            f", confirmed on seeds {', '.join(map(str, [chosen.seed, *sorted(seeds)]))}"
            if seeds
            else ", not confirmed on other seeds"
        )
    )
    found = speedup(result, chosen)
    if chosen.config.float8 and emulated(device):
        return f"{said}; float8 emulated on {device}: no speed is claimed for it"
    if found is None:
        return f"{said}; speed against float32 unknown on {device}"
    return f"{said}; {found.verdict(device, note=False)}{_clipping_clause(result)}"


def _covers(result: Findings) -> str:
    return f". Evidence covers {covers(result)}"


def covers(result: Findings) -> str:
    """The steps that the runs the verdict rests on trained from step 0: those of the best AMP
    config that held (what float32 is compared with), else of the answer; each run on every
    seed it ran (its confirmations). The float32 reference always trains to the horizon.

    Args:
        result: The search's findings.

    Returns:
        ``steps 0-N of the horizon`` where every run trained to it (over a horizon longer
        than a trial, the finalists' phases cover it), else the fewest steps any of them
        trained, where each stopped after reaching the target, and how much further float32's
        own loss fell after that on that run's seed.

    Example:
        >>> covers(result)  # doctest: +SKIP
        "steps 0-60 of the 200-step horizon: trial #4's 3 runs stopped at steps 60, 60, 70 ..."
    """
    outcome = result.best_amp or result.recommended or result.float32_choice
    horizon = result.horizon
    full = f"steps 0-{horizon} of the horizon"
    if outcome is None or result.long:
        return full
    confirmed = result.confirmations.get(outcome.number, {})
    runs = [outcome, *(confirmed[seed] for seed in sorted(confirmed))]
    steps = [int(o.figures.steps_run or 0) for o in runs]
    shortest = min(steps)
    if shortest >= horizon:
        return full
    said = (
        f"steps 0-{shortest} of the {horizon}-step horizon: {outcome.label}'s "
        f"{plural(len(runs), 'run')} stopped at "
        f"{'step' if len(runs) == 1 else 'steps'} {', '.join(map(str, steps))} on "
        f"{'seed' if len(runs) == 1 else 'seeds'} {', '.join(str(o.seed) for o in runs)}, "
        f"{_why_stopped(runs)}"
    )
    # the shortest run's own seed: its float32 reference is the one it was judged against
    seed = runs[steps.index(shortest)].seed
    ref = result.references.get(seed)
    curve = ref.target.reference_curve if ref is not None else ()
    if len(curve) >= shortest and curve[-1]:
        fell = (curve[shortest - 1] - curve[-1]) / abs(curve[-1])
        moved = f"fell {fell:.1%} further" if fell >= 0 else f"rose {-fell:.1%}"
        said += (
            f"; float32's loss on seed {seed} (where the run stopped first) {moved} "
            f"by step {len(curve)}"
        )
    return said


def _why_stopped(runs: list[Outcome]) -> str:
    """Why the runs ``covers`` names stopped before the horizon: after reaching the target (a
    search's answer always did), or, for a run chosen by hand, where it was pruned."""
    if all(o.reached for o in runs):
        return "after reaching the target"
    kinds = sorted({PRUNE_KINDS.get(str(o.prune_kind), "pruned") for o in runs if o.prune_kind})
    said = f"pruned ({', '.join(kinds)})" if kinds else "stopped early"
    if all(o.steps_to_target is None for o in runs):
        said += " without reaching the target"
    return said


def _no_amp(result: Findings) -> str:
    """Why no AMP config is recommended: none reached the target, none held for the
    horizon (per dtype, where it fell behind), or none was confirmed."""
    if result.missing and not any(result.holds(c) for c in result.pool):
        runs = plural(len(result.missing), "run")
        return (
            f"no AMP config is proven yet: the evidence of {runs} is missing (a fault "
            "outside the configs, not a verdict on them: see 'Missing evidence'), and a "
            "rerun of the same command completes it"
        )
    judged = [o for o in result.ranking if o.config.dtype != "float32"]
    if not judged and result.failed:
        runs = plural(result.failed, "run")
        return (
            f"no AMP config was judged: no AMP run finished, and {runs} raised an error (see "
            "'Failed'), which says nothing of the configs: fix what they raised and rerun"
        )
    if not result.pool:
        return "no AMP config reached the float32 target: " + _none_reached(judged)
    failed = [f for f in result.finalists + result.islands if result.holds(f) is False]
    if result.long and failed and not any(result.holds(c) for c in result.pool):
        per_dtype: dict[str, str] = {}
        for f in failed:
            per_dtype.setdefault(
                f.config.dtype, f"{f.config.dtype} ({f.label}) {why_not(result, f)}"
            )
        return "no AMP config holds for the horizon: " + "; ".join(per_dtype.values())
    return "no AMP config stayed finite and reached the target on every confirmation seed" + (
        " and held for the horizon" if result.long else ""
    )


def _none_reached(judged: list[Outcome]) -> str:
    """What the AMP runs did instead of reaching the target: how many were pruned, for what,
    and how close the runs that trained on ended, from the runs themselves."""
    runs = [o for o in judged if not o.reused]
    said = []
    pruned = pruned_by_kind(runs)
    if pruned:  # one kind: its words alone; several: each counted
        counted = [(n, PRUNE_KINDS.get(k, k)) for k, n in sorted(pruned.items())]
        kinds = counted[0][1] if len(counted) == 1 else ", ".join(f"{n} {w}" for n, w in counted)
        said.append(f"{sum(pruned.values())} pruned ({kinds})")
    trained = [o for o in runs if o.state != "pruned"]
    if trained:
        closest = min(trained, key=lambda o: o.figures.loss_vs_float32 or math.inf)
        ratio, at = closest.figures.loss_vs_float32, closest.figures.loss_vs_float32_step
        near = (
            f" (the closest, {closest.label}, at {ratio:.3g}x float32's loss at step {at})"
            if ratio is not None
            else ""
        )
        said.append(f"{len(trained)} trained on without reaching it{near}")
    if not said:
        return "no AMP run finished"
    return f"of {plural(len(runs), 'AMP run')}, " + " and ".join(said)


def _clipping_clause(result: Findings) -> str:
    """Whose steps the verdict compares with, when the best AMP config clips otherwise than
    the workload: float32 clipped the same way, which is the fair comparison; whether the clip
    alone saves steps is judged against float32's seed-to-seed spread, as the answer is."""
    twin, ref = result.float32_clip, result.reference
    if twin is None or ref is None:
        return ""
    clip = f"clip {twin.config.clip_norm:.3g}"
    if not twin.reached:
        return (
            f"; float32 with the same {clip} never reaches the target, so the "
            "comparison is with the float32 reference"
        )
    steps, ref_steps = twin.steps_to_target, ref.steps_to_target
    said = f"; against float32 at the same {clip} (target at step {steps}"
    if not ref_steps or steps is None or steps >= ref_steps:
        return said + ")"
    if fewer_steps(steps, ref_steps, result.spread):
        return (
            f"{said}, where the float32 reference needs {ref_steps}: the clipping, not the "
            "precision, saves those steps)"
        )
    return (
        f"{said}, the float32 reference's {ref_steps} within float32's seed-to-seed spread "
        f"of {result.spread:.0%}: a tie)"
    )
