"""The yardstick of the horizon's verdicts: a plain AMP loop, as a user writes it (autocast,
torch.amp.GradScaler, unscale_ then clip_grad_norm_), trained the whole horizon, with no
scalertune code in the loop (a config's float32 islands are the runtime's hooks, applied to
the model first, as training code applies them with amp.prepare)."""

import itertools
import math
import random

import numpy as np
import torch

from scalertune._amp._islands import apply_islands


def losses(factory, config, steps, seed=0):
    """Per-step losses of ``config`` trained ``steps`` steps from a fresh ``factory()``."""
    return train(factory, config, steps, seed)[0]


def skipped_steps(factory, config, steps, seed=0):
    """The steps GradScaler skipped (found an inf or NaN in the scaled gradients) when
    ``config`` trained ``steps`` steps from a fresh ``factory()``."""
    return train(factory, config, steps, seed)[1]


def train(factory, config, steps, seed=0):
    """``config`` trained ``steps`` steps from a fresh ``factory()``: each step's loss, and the
    steps the scaler skipped (its scale fell in that step's ``update()``: a back-off)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    parts = factory()
    model, optimizer, loss_fn = parts["model"], parts["optimizer"], parts["loss_fn"]
    apply_islands(model, config.fp32_modules, "cpu")
    scaler = torch.amp.GradScaler(
        "cpu",
        init_scale=config.init_scale,
        growth_factor=config.growth_factor,
        backoff_factor=config.backoff_factor,
        growth_interval=config.growth_interval,
        enabled=config.uses_scaler,
    )
    dtype = getattr(torch, config.dtype)
    out, skipped = [], []
    batches = itertools.islice(itertools.cycle(parts["batches"]), steps)
    for t, (x, y) in enumerate(batches):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype, enabled=config.dtype != "float32"):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        if config.clip_norm is not None:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_norm)
        scaler.step(optimizer)
        scale = scaler.get_scale() if config.uses_scaler else None
        scaler.update()
        if scale is not None and scaler.get_scale() < scale:
            skipped.append(t)
        out.append(loss.item())
    return out, skipped


def ratio_at_the_end(factory, config, steps, seed=0, window=50):
    """``config``'s mean loss over float32's over the last ``window`` steps of the horizon
    (``inf`` when it went non-finite)."""
    from scalertune import AmpConfig

    own_clip = factory().get("clip_norm")  # the workload's own clipping is float32's too
    ours = losses(factory, config, steps, seed)[-window:]
    theirs = losses(factory, AmpConfig(dtype="float32", clip_norm=own_clip), steps, seed)[-window:]
    if not all(np.isfinite(ours)):
        return float("inf")
    return float(np.mean(ours) / np.mean(theirs))


def tail_loss(factory, amp, steps=3000, batch=None, seed=0):
    """The end of a plain loop of ``factory``'s workload: through ``amp.train_step`` (with its
    clipping) or, with ``amp`` None, float32 with the workload's own clipping; the mean loss
    of the last 100 steps that are not a burst's (``batch(batches, step)`` picks each step's
    batch; a replaced target is a burst's), inf where one is not finite."""
    torch.manual_seed(seed)
    w = factory()
    model, optimizer, loss_fn, batches = w["model"], w["optimizer"], w["loss_fn"], w["batches"]
    clip = w.get("clip_norm")
    seen = []
    for step in range(steps):
        x, y = batch(batches, step) if batch else batches[step % len(batches)]
        if amp is None:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
        else:
            loss = amp.train_step(model, optimizer, loss_fn, (x, y))
        if batch is None or batch(batches, step)[1] is batches[step % len(batches)][1]:
            seen.append(float(loss.detach()))
    tail = seen[-100:]
    return sum(tail) / len(tail) if all(map(math.isfinite, tail)) else math.inf


def predicted(factory, config, horizon=200):
    """What a search writes for ``config`` (a ``ScalerPrediction``): the replay over the
    gradient trace of float32's ``horizon``-step run of ``factory``'s workload."""
    from scalertune._amp._config import AmpConfig
    from scalertune._amp._watch import ScalerPrediction
    from scalertune._replay._predict import predict
    from scalertune._run._loop import Plan, run_config
    from scalertune._run._trace_collector import TraceCollector

    reference = run_config(
        factory,
        AmpConfig(dtype="float32", clip_norm=config.clip_norm),
        steps=horizon,
        seed=0,
        device=torch.device("cpu"),
        plan=Plan(watcher=TraceCollector(horizon)),
    )
    p = predict(reference.trace, config, horizon=horizon)
    return ScalerPrediction(
        horizon=horizon,
        skipped_steps=p.skipped_steps,
        skipped_first=p.startup_skips,
        min_scale=p.min_scale,
        final_scale=p.final_scale,
    )


def random_configs(n, seed):
    """``n`` float16 configs over the shipped space's ranges (search_spaces/float16.yaml):
    init_scale 2**U(-4, 24), growth U(1.25, 4), backoff U(0.125, 0.75), growth interval
    log-uniform over 10..5000."""
    from scalertune import AmpConfig

    rng = np.random.default_rng(seed)
    return [
        AmpConfig(
            init_scale=float(2.0 ** rng.uniform(-4, 24)),
            growth_factor=float(rng.uniform(1.25, 4)),
            backoff_factor=float(rng.uniform(0.125, 0.75)),
            growth_interval=round(math.exp(rng.uniform(math.log(10), math.log(5000)))),
        )
        for _ in range(n)
    ]
