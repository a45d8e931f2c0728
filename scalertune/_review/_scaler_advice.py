"""What GradScaler will do over the horizon, as the replay tells it, in the summary's words.

- the **advice**: PyTorch's defaults over the whole horizon, against the setting the replay
  found best (``role: replay``, when one beat them beyond the noise and was trained): whether
  changing the defaults is worth it at all;
- the **article's fix** (``init_scale=4096``), replayed where a short search did not train it;
- the **agreement**: how the replay's predicted skipped steps compare with the search's own
  float16 runs, each over the steps it trained, within the replay's calibrated tolerance.
"""

from __future__ import annotations

import dataclasses

from scalertune._amp._config import baselines, defaults_words
from scalertune._judge._findings import Findings
from scalertune._judge._outcome import Outcome
from scalertune._judge._rank import skip_tolerance
from scalertune._replay._predict import Prediction, predict
from scalertune._replay._trace import Trace
from scalertune._storage._names import ROLE_REPLAY


def defaults_prediction(result: Findings, trace: Trace, name: str | None = None) -> Prediction:
    """The framework's defaults (PyTorch's, DeepSpeed's; or another baseline by ``name``),
    with the clip and islands of the best float16 run, over the horizon."""
    run = next((o for o in result.pool if o.config.dtype == "float16"), None)
    named = baselines(result.deepspeed)
    base = named[name] if name is not None else next(iter(named.values()))
    if run is not None:
        base = dataclasses.replace(
            base, clip_norm=run.config.clip_norm, fp32_modules=run.config.fp32_modules
        )
    return predict(trace, base, horizon=result.horizon, zero=result.settings.zero)


def scaler_advice(result: Findings) -> str | None:
    """One line: whether changing PyTorch's scaler defaults is worth it over the horizon;
    none where no float16 run trained, or every one overflowed in the forward pass (the
    replay models the gradients: the overflow's own line says what to do), and no advice
    where the replay missed most of the runs it was checked on (:func:`replay_agreement`)."""
    if "float16" not in result.settings.space_dtypes:
        return None
    trace = result.trace
    if trace is None or result.forward_overflow_modules is not None or not _scaled(result):
        return None  # no float16 run trained (each raised, or overflowed in the forward)
    defaults = defaults_prediction(result, trace)
    words = defaults_words(result.deepspeed)
    said = f"Scaler over the horizon: {words}: {defaults.describe()}"
    agree, checked = _agreement(result, trace)
    if checked and 2 * agree < checked:
        return (
            f"{said}, as the replay predicts; but it missed the skipped steps of "
            f"{checked - agree} of {checked} float16 runs (the replay check below), so no "
            "advice is drawn from it here"
        )
    if result.deepspeed:  # no replay's choice: the trials sample DeepSpeed's knobs themselves
        run = result.recommended or result.best_amp
        if run is None or not run.config.uses_scaler:
            return said
        ours = predict(trace, run.config, horizon=result.horizon, zero=result.settings.zero)
        return f"{said}; the answer's fp16 block: {ours.describe()}"
    chosen = next((o for o in result.ranking if o.role == ROLE_REPLAY), None)
    if chosen is None and not any(o.config.dtype == "float16" for o in result.pool):
        return (  # "keep them" would read as advice to train float16, which the answer is not
            said + "; no setting of the space skips fewer beyond the noise, and no float16 "
            "run reached the target whatever its scaler: the scaler's knobs are not what "
            "fails here"
        )
    if chosen is None:
        return (
            said + f"; no setting of the space skips fewer beyond the noise: {words} are as "
            "good here, keep them"
        )
    ours = predict(trace, chosen.config, horizon=result.horizon, zero=result.settings.zero)
    return (
        f"{said}; {chosen.label} [{chosen.config.describe()}] {ours.describe()}: changing "
        "the defaults is worth it"
    )


def article_fix_line(result: Findings) -> str | None:
    """What the replay says of the article's ``init_scale=4096`` where a search over a
    trial's horizon did not train it: the replay could not tell it from PyTorch's defaults
    beyond the noise. (Over a long horizon it is never trained, and the scaler's advice
    speaks for every setting.)"""
    trace = result.trace
    name = list(baselines(result.deepspeed))[1]
    if (
        result.long
        or "float16" not in result.settings.space_dtypes
        or trace is None
        or name in result.baselines
    ):
        return None
    fix = defaults_prediction(result, trace, name)
    return (
        f"{name}, the article's fix, replayed (not trained: it skips as "
        f"{defaults_words(result.deepspeed)} do, within the noise): {fix.describe()}"
    )


def replay_agreement(result: Findings) -> str | None:
    """How many of the search's float16 runs skipped as many steps as the replay predicted
    for them over the steps they ran, within max(2, 20%): runs whose forward overflowed are
    left out (the replay replays float32's gradients, not the forward), and said to be; a
    replay that missed most runs is said to be no evidence for the workload."""
    trace = result.trace
    if trace is None:
        return None
    agree, checked = _agreement(result, trace)
    forward = len([o for o in _scaled(result) if o.prune_kind == "forward"])
    if not checked:
        return None
    said = (
        f"Replay check: the predicted skipped steps of {agree} of {checked} float16 "
        f"runs on seed {result.settings.seed} (the seed whose gradients the replay traced) "
        "match what they really skipped, within max(2, 20%)"
    )
    if forward:
        said += (
            f" ({forward} more overflowed in the forward pass, which the replay of the "
            "gradients does not model)"
        )
    if 2 * agree < checked:
        said += (
            ": the replay does not hold for this workload (float16 changes its gradients, "
            "or an activation overflows now and then), so its predictions are no evidence "
            "here; the runs' own figures are"
        )
    return said


def _scaled(result: Findings) -> list[Outcome]:
    """The search's float16 runs with a scaler that trained and recorded their scale."""
    return [o for o in result.ranking if o.config.uses_scaler and o.steps_run and o.scales]


def _agreement(result: Findings, trace: Trace) -> tuple[int, int]:
    """How many of the search's float16 runs (forward overflows left out) the replay
    predicted the skipped steps of, within max(2, 20%), and of how many."""
    runs = [o for o in _scaled(result) if o.prune_kind != "forward"]
    agree = 0
    for run in runs:
        real = int(run.figures.skipped_steps or 0)
        predicted = predict(
            trace, run.config, horizon=min(run.steps_run, trace.steps), zero=result.settings.zero
        )
        agree += abs(predicted.skipped_steps - real) <= skip_tolerance(real)
    return agree, len(runs)
