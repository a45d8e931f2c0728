"""The terminal summary: float32, the baselines, the best trials, what was pruned, the verdict."""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any

from scalertune._judge._outcome import Outcome
from scalertune._review._describe import describe_outcome
from scalertune._run._record import PRUNE_KINDS
from scalertune._run._timing import spread
from scalertune._storage._names import ROLE_SEARCH
from scalertune._text import format_table

if TYPE_CHECKING:
    from scalertune._review._result import SearchResult

_COLUMNS = ("run", "config", "skipped", "min scale", "steps to target", "ms/step",
            "time to target", "loss/fp32 @step", "steps run")


def render(result: "SearchResult", *, top: int) -> str:
    s = result.settings
    lines = [f"scalertune study {result.study_name!r}"
             + (f" in {result.storage}" if result.storage else ""),
             f"  workload {s.get('factory')}, {s.get('steps')} steps, seed {s.get('seed')}, "
             f"space {(s.get('space') or {}).get('name')!r}, on {s.get('device')}"]
    ref, target = result.reference, result.target
    if ref is None or target is None:
        lines.append("  no float32 reference yet: nothing to compare with.")
        return "\n".join(lines)
    lines.append(f"  float32 target loss {target.loss:.4g} (float32 ends at "
                 f"{target.reference_final:.4g}, from {target.reference_start:.4g})")
    times = result.step_times
    if times is not None:
        lines.append("  step time, interleaved: " + ", ".join(
            f"{d} {times.median(d) * 1e3:.3g} ms" + ("" if d == "float32" else
                                                     f" ({_spread(times.ratios(d))} float32's)")
            for d in times.rounds))
    rows: list[tuple[str, ...]] = [_COLUMNS]
    ref_config = result.settings.get("reference") or {}
    rows.append(("float32 reference", _describe_reference(ref_config), "-", "-",
                 _int(ref.get("steps_to_target")), _ms(ref.get("step_time_s")),
                 _sec(result.reference_time_to_target), "1", _int(ref.get("steps_run"))))
    if result.float32_clip is not None:
        rows.append(_row(result.float32_clip.label, result.float32_clip))
    for name, outcome in result.baselines.items():
        rows.append(_row(name, outcome))
    searched = [o for o in result.ranking if o.role == ROLE_SEARCH and o.state == "complete"]
    for outcome in searched[:top]:
        rows.append(_row(f"trial #{outcome.number}", outcome))
    lines.append("")
    lines.extend(format_table(rows))
    lines.append("")
    for name, outcome in result.baselines.items():
        lines.append(f"{name}: {describe_outcome(outcome)}")
    searched_runs = [o for o in result.ranking if o.role == ROLE_SEARCH]
    n_search = len(searched_runs)
    pruned: dict[str, int] = {}
    for o in searched_runs:
        if o.state == "pruned":
            pruned[o.prune_kind or "unknown"] = pruned.get(o.prune_kind or "unknown", 0) + 1
    counted = ", ".join(f"{n} {PRUNE_KINDS.get(k, k)}" for k, n in sorted(pruned.items()))
    reused = result.reused
    lines.append(f"{n_search} sampled trials finished; pruned {sum(pruned.values())}"
                 + (f" ({counted})" if counted else "")
                 + (f"; {reused} reused an earlier run of the same config" if reused else ""))
    broken = [f"{_runs(result.failed)} raised an error"] if result.failed else []
    if result.lost:
        broken.append(f"{_runs(result.lost)} interrupted or lost with their worker")
    if broken:
        why = " (each trial's error attribute says why)" if result.failed else ""
        lines.append(f"Failed: {'; '.join(broken)}{why}")
    if result.stop_reason:
        lines.append(f"Sampling stopped early: {result.stop_reason}")
    hint = result.forward_overflow_hint()
    if hint:
        lines.append(hint)
    lines.append("")
    rec = result.recommended
    if rec is not None:
        seeds = sorted(result.confirmations.get(rec.number, {}))
        lines.append(f"Recommended: {rec.label} [{rec.config.describe()}]")
        lines.append(f"  confirmed on seeds {', '.join(map(str, [rec.seed, *seeds]))}: "
                     f"{describe_outcome(rec)}")
    else:
        lines.append("Recommended: float32 (no autocast, no scaler)")
    ahead = result.candidates.index(rec) if rec else len(result.candidates)
    for candidate in result.candidates[:ahead]:
        lines.append(f"  not confirmed: {candidate.label} [{candidate.config.describe()}] "
                     f"{_confirm_failure(result, candidate)}")
    lines.append(f"Verdict: {result.verdict}")
    lines.append(f"Cost: {result.run_equivalents:.1f} float32 runs ({result.steps_trained} "
                 f"training steps over all runs and the step timing)")
    if result.interrupted:
        lines.append("Interrupted: every finished trial is kept; rerun the same command to resume.")
    return "\n".join(lines)


def _confirm_failure(result: "SearchResult", candidate: Outcome) -> str:
    runs = result.confirmations.get(candidate.number, {})
    bad = [f"seed {s}: {describe_outcome(o)}" for s, o in sorted(runs.items()) if not o.reached]
    return "; ".join(bad) if bad else "(confirmation incomplete)"


def _row(label: str, o: Outcome) -> tuple[str, ...]:
    a = o.attrs
    if o.state == "pruned":
        kind = o.prune_kind or "pruned"
        step = a.get("first_nonfinite_step") if kind != "slower" else a.get("steps_run")
        reached = f"{'slower' if kind == 'slower' else 'pruned'}@{step if step is not None else '?'}"
    else:
        reached = _int(a.get("steps_to_target"))
    ratio = a.get("loss_vs_float32")
    at = "-" if ratio is None else f"{float(ratio):.3g} @{a.get('loss_vs_float32_step')}"
    return (label, o.config.describe(), _int(a.get("skipped_steps")), _g(a.get("min_scale")),
            reached, _ms(a.get("step_time_s")),
            _sec(o.time_to_target if o.reached else math.nan), at, _int(a.get("steps_run")))


def _spread(ratios: list[float]) -> str:
    low, high = spread(ratios)
    return f"{statistics.median(ratios):.2f}x, {low:.2f}-{high:.2f}x"


def _describe_reference(config: dict[str, Any]) -> str:
    clip = config.get("clip_norm")
    return "float32" + (f", clip {clip:.3g} (the workload's)" if clip else "")


def _int(v: Any) -> str:
    return "never" if v is None else str(int(v))


def _g(v: Any) -> str:
    return "-" if v is None else f"{float(v):.3g}"


def _ms(v: Any) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v * 1e3:.3g}"


def _sec(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:.3g}s"


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"
