"""The result file's content: ``config`` for the runtime, ``guard``, and the ``evidence``.

``evidence`` says what the answer rests on, in full precision: the study and the device
(and ``nproc_per_node``, the ranks every run trained on per host, where more than one; with
``nnodes`` and ``hosts`` where the runs spanned hosts),
the horizon (``horizon``) and the steps of it that the runs the verdict rests on trained
(``covers``: steps 0 to the horizon, or where they stopped after reaching the target), the
verdict and speedup against float32, the recommended run and its confirmations, the best AMP
config that held (``best_amp``, also when float32 is the answer on this device), each
finalist's phases, float32's figures, the baselines, the replay's prediction of the scaler
over the horizon, and what the search cost in run-equivalents of the horizon.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from scalertune import _policy
from scalertune._amp._config import DeepSpeedFp16Config
from scalertune._amp._guard import Guard
from scalertune._judge._findings import Findings, speedup
from scalertune._judge._outcome import Outcome
from scalertune._judge._speedup import emulated
from scalertune._replay._deepspeed_block import deepspeed_fp16_block
from scalertune._replay._predict import Prediction, predict, predict_deepspeed
from scalertune._review import _policy as _review_policy
from scalertune._review._describe import describe_outcome
from scalertune._review._scaler_advice import defaults_prediction
from scalertune._review._verdict import covers, verdict
from scalertune._run._record import skipped_steps


def document(result: Findings) -> dict[str, Any]:
    """The recommendation and its evidence as plain data (the YAML file's content)."""
    data: dict[str, Any] = {"config": result.config.to_dict()}
    found = guard(result, result.recommended)
    if found is not None:
        data["guard"] = _guard_block(found)
    said = deepspeed_guard(result, result.recommended)
    if said is not None:
        data["guard"] = said
    data["evidence"] = evidence(result)
    return data


def evidence(result: Findings) -> dict[str, Any]:
    settings, rec = result.settings, result.recommended
    out: dict[str, Any] = {
        "study": result.study_name,
        "storage": result.storage,
        "factory": settings.factory,
        "device": settings.device,
        **_world(settings),
        "steps": settings.steps,
        "horizon": result.horizon,
        "covers": covers(result),
        "search_space": settings.space_name,
        **({"deepspeed": dict(settings.deepspeed)} if settings.deepspeed is not None else {}),
        # the model searched (its parameters' names and shapes), which load and attach check
        **({"model": dict(settings.model)} if settings.model is not None else {}),
        "verdict": verdict(result),
    }
    if rec is not None:  # the answer's speed; a float32 answer's AMP speed is best_amp's
        out["speedup_vs_float32"] = _speedup(result, rec)
        out.update(_run_block(result, rec))
    if result.best_amp is not None:
        out["best_amp"] = {
            "config": result.best_amp.config.to_dict(),
            "speedup_vs_float32": _speedup(result, result.best_amp),
            **_run_block(result, result.best_amp),
        }
        found = guard(result, result.best_amp)
        if found is not None:  # for scalertune.load(..., best_amp=True)
            out["best_amp"]["guard"] = _guard_block(found)
        said = deepspeed_guard(result, result.best_amp)
        if said is not None:
            out["best_amp"]["guard"] = said
    if result.float32_clip is not None:
        out["float32_same_clip"] = {
            "config": result.float32_clip.config.to_dict(),
            **_run_evidence(result.float32_clip),
        }
    if result.reference:
        out["float32"] = _float32(result)
    if result.long:
        out["finalists"] = {
            f.label: {
                "config": f.config.to_dict(),
                "holds": result.holds(f),
                "phases": _phases(result, f),
            }
            for f in [*result.finalists, *result.islands]
        }
    for name, outcome in result.baselines.items():
        out[name] = {"config": outcome.config.to_dict(), **_run_evidence(outcome)}
    out.update(_predictions(result))
    out["cost"] = {
        "run_equivalents": _num(result.run_equivalents),
        "training_steps": result.steps_trained,
        "of": f"{result.horizon}-step runs (the horizon)",
    }
    if result.stop_reason:
        out["stopped_early"] = result.stop_reason
    if result.missing:  # a fault outside the configs: a rerun completes it
        out["missing"] = {f"trial {n}": why for n, why in sorted(result.missing.items())}
    if result.damaged:  # stored evidence that is not what a run stores: left out
        out["damaged"] = {f"trial {n}": why for n, why in sorted(result.damaged.items())}
    return out


def _world(settings: Any) -> dict[str, Any]:
    """The processes every run trained on per host (``--nproc-per-node``, or the user's
    launcher), where more than one, and the hosts the runs spanned, where more than one."""
    out: dict[str, Any] = {}
    if settings.nproc_per_node > 1 or settings.nnodes > 1:
        out["nproc_per_node"] = settings.nproc_per_node
    if settings.nnodes > 1:
        out.update(nnodes=settings.nnodes, hosts=list(settings.hosts))
    return out


def _predictions(result: Findings) -> dict[str, Any]:
    """For a float16 answer (or best AMP config): what its scaler will do over the horizon,
    and the framework's defaults', replayed from the float32 reference's trace; for a
    GradScaler config, also what DeepSpeed's dynamic loss scaler would do with the config's
    export. (A DeepSpeed answer's own prediction is DeepSpeed's: its fp16 block, under ZeRO.)"""
    run = result.recommended or result.best_amp
    trace = result.trace
    if run is None or not run.config.uses_scaler or trace is None:
        return {}
    ours = predict(trace, run.config, horizon=result.horizon, zero=result.settings.zero)
    defaults = "deepspeed_default" if result.deepspeed else "pytorch_default"
    out = {
        "prediction": prediction_block(ours),
        f"{defaults}_prediction": prediction_block(defaults_prediction(result, trace)),
    }
    if not isinstance(run.config, DeepSpeedFp16Config):
        out["deepspeed_prediction"] = prediction_block(
            predict_deepspeed(trace, deepspeed_fp16_block(run.config), horizon=result.horizon)
        )
    return out


def prediction_block(found: Prediction) -> dict[str, Any]:
    return {
        "horizon": found.horizon,
        "skipped_steps": found.skipped_steps,
        "skipped_first": found.startup_skips,
        "startup_steps": found.startup_span,
        "min_scale": _num(float(found.min_scale)),
        "final_scale": _num(float(found.final_scale)),
        **({"stops_at": found.stops_at} if found.stops_at is not None else {}),
        "says": found.describe(),
    }


def _run_block(result: Findings, outcome: Outcome) -> dict[str, Any]:
    confirmed = result.confirmations.get(outcome.number, {})
    block = {
        "trial": outcome.number,
        "seeds": [outcome.seed, *sorted(confirmed)],
        **_run_evidence(outcome),
        "confirmation": {f"seed {s}": _run_evidence(o) for s, o in sorted(confirmed.items())},
    }
    if result.long:
        block["phases"] = _phases(result, outcome)
    return block


def _phases(result: Findings, outcome: Outcome) -> list[dict[str, Any]]:
    return [
        {
            "steps": [p.start, p.end],
            "loss_vs_float32": _num(p.ratio),
            "z": _num(p.z),
            "nonfinite": p.nonfinite,
            "holds": p.holds,
            "from_start": p.from_start,
        }
        for p in result.phases.get(outcome.number, [])
    ]


def _float32(result: Findings) -> dict[str, Any]:
    ref = result.reference
    return {
        "target_loss": _num(None if ref is None else ref.target_loss),
        "steps_to_target": None if ref is None else ref.steps_to_target,
        "step_time_s": _num(None if ref is None else ref.step_time_s),
        "time_to_target_s": _num(result.reference_time_to_target),
        "seed_spread": _num(result.spread),
    }


def _speedup(result: Findings, outcome: Outcome | None) -> dict[str, Any] | None:
    """The speed against float32; none for float8 timed emulated (not float8's speed)."""
    if outcome is not None and outcome.config.float8 and emulated(result.settings.device):
        return None
    found = speedup(result, outcome)
    return (
        None
        if found is None
        else {
            "point": _num(found.point),
            "low": _num(found.low),
            "high": _num(found.high),
            "step_time_ratio": _num(found.step_time_ratio),
        }
    )


def _guard_block(found: Guard) -> dict[str, Any]:
    return {"min_scale": found.min_scale, "max_consecutive_skips": found.max_consecutive_skips}


def guard(result: Findings, rec: Outcome | None) -> Guard | None:
    """The production guard the evidence supports for ``rec`` (float16 only): a floor
    ``GUARD_SCALE_MARGIN_POWERS`` powers of two below the smallest scale any run of that
    config reached, and twice its longest run of skipped steps (at least the search's own
    limit)."""
    if rec is None or not rec.config.uses_scaler or isinstance(rec.config, DeepSpeedFp16Config):
        return None
    runs = [rec, *result.confirmations.get(rec.number, {}).values()]
    lowest = min(min(o.scales) if o.scales else o.config.init_scale for o in runs)
    streak = max(_longest_skip_streak(o) for o in runs)
    floor = max(lowest / 2.0**_review_policy.GUARD_SCALE_MARGIN_POWERS, _policy.SCALE_FLOOR)
    return Guard(
        min_scale=float(f"{floor:.6g}"),
        max_consecutive_skips=max(_policy.MAX_CONSECUTIVE_SKIPS, 2 * streak),
    )


def deepspeed_guard(result: Findings, rec: Outcome | None) -> str | None:
    """For a DeepSpeed fp16 answer, its guard in one line: DeepSpeed's own (an overflow at
    ``min_loss_scale`` raises and ends the training), how near the search's runs came to it,
    and what to do when it raises."""
    if rec is None or not isinstance(rec.config, DeepSpeedFp16Config):
        return None
    config = rec.config
    runs = [rec, *result.confirmations.get(rec.number, {}).values()]
    lowest = min(min(o.scales) if o.scales else config.init_scale for o in runs)
    above = math.log2(lowest / config.min_loss_scale) if lowest > 0 else 0.0
    lower = " or a lower min_loss_scale" if config.min_loss_scale > 1 else ""
    return (
        f"DeepSpeed guards this itself: an overflow with the loss scale at min_loss_scale "
        f"{config.min_loss_scale} raises 'Current loss scale already at minimum' and ends "
        f"the training (the search's runs of it went no lower than {lowest:g}, "
        f"{above:.3g} halvings above it); if it raises, resume from your last checkpoint "
        f"with a larger hysteresis{lower}, and if it raises again the forward pass overflows "
        "float16 at any scale: train in bf16"
    )


def _longest_skip_streak(outcome: Outcome) -> int:
    skipped = set(skipped_steps(outcome.scales, outcome.config.init_scale))
    longest = current = 0
    for i in range(len(outcome.scales)):
        current = current + 1 if i in skipped else 0
        longest = max(longest, current)
    return longest


def _run_evidence(outcome: Outcome) -> dict[str, Any]:
    out: dict[str, Any] = {"outcome": describe_outcome(outcome)}
    scaled = outcome.config.uses_scaler  # a config without a scaler has no scale to report
    for key, value in dataclasses.asdict(outcome.figures).items():
        if key in ("min_scale", "final_scale") and not scaled:
            continue
        if value is not None:
            out[key] = _num(value)
    return out


def _num(value: Any) -> Any:
    if isinstance(value, float):
        return None if not math.isfinite(value) else float(f"{value:.6g}")
    return value
