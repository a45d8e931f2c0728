"""GradScaler's update rule, exactly, and its replay over a gradient trace: one config, or many.

**The rule.** GradScaler keeps its scale in a float32 tensor. After each step ``update()``
(the kernel ``torch._amp_update_scale_``, one code path on the CPU and on CUDA) does one of
two things:

- the step's gradients held an inf or NaN, so ``step()`` skipped the optimizer: the scale
  becomes ``float32(scale * backoff_factor)`` (the product formed in double, then rounded)
  and the count of good steps restarts at zero;
- otherwise the count goes up; when it reaches ``growth_interval`` the scale becomes
  ``float32(scale * growth_factor)`` if that is finite (else it stays: a scale never grows
  to inf), and the count restarts either way.

So after the last restart at step ``r`` (``-1`` before the first step) the next growth comes
at the end of step ``r + growth_interval``, unless a step up to it overflows first.
:func:`update_scales` is this rule, float for float, given which steps overflowed; it matches
GradScaler's own ``_scale`` bit for bit (``tests/unit/test_replay.py``).

**Which steps overflow** is the trace's part. Backward runs on ``loss * scale``; a float16
gradient is inf once its scaled magnitude reaches :data:`THRESHOLD`. So step ``t`` overflows
at scale ``S`` when ``S >= limit[t] = THRESHOLD / amax[t]`` (:func:`limits`), ``amax[t]``
being the largest gradient float16 holds in that step's backward, unscaled: what the float32
reference records (:class:`~scalertune._replay._trace.Trace`). Every replay here makes that one
comparison, so they agree with each other exactly.

**The start-up.** A scale too large for the first gradients skips step after step, and while
every step so far was skipped the weights have not moved: those steps see the gradients of
the *initial* weights, which ``Trace.startup`` holds (one per batch of the start-up probe),
not the trace's, whose model has trained ``t`` steps by step ``t``. Both replays use it for
that streak. After it the one-config :func:`replay` follows the run's lag (a run that has
skipped ``k`` steps has made ``t - k`` updates; see :func:`replay`); :func:`replay_many`
reads the trace at ``t`` (open loop), which ranks many configs fast.

Not modelled: below a scale of about ``3e-39`` GradScaler's ``1/scale`` is inf in float32.
The scaled float16 gradients are zeros by then, and on a CPU ``unscale_`` turns them into NaN
(``inf * 0``) without flagging the step: it is taken, and the weights become NaN (measured on
torch 2.13: at ``1e-39`` no step skipped, the weights NaN; at ``3e-39`` the gradients zero and
the weights finite). A search prunes a run long before (``_policy.SCALE_FLOOR`` is
``2**-24``), and the guard a training run loads stops it at the same floor.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np

from scalertune import _policy
from scalertune._amp._config import AmpConfig
from scalertune._errors import ParameterError

#: The smallest magnitude float16 rounds to inf (``_policy.FLOAT16_OVERFLOW``).
THRESHOLD = _policy.FLOAT16_OVERFLOW

#: :func:`replay_many` advances configs in blocks no longer than the smallest growth interval
#: (so that none grows twice in a block) and at most this long. Numpy's cost per call (about a
#: microsecond) sets the floor: longer blocks make fewer calls, but each config near the
#: overflow boundary then compares more steps. Measured on 1,000 configs with intervals of 128
#: and more over 100,000 steps: blocks of 16, 32, 64, 128 took 0.24, 0.19, 0.16, 0.16 s.
MAX_BLOCK = 64

#: Configs whose growth interval is below this go step by step instead (one pass of a dozen
#: numpy calls per step for all of them). Around 8 the two cost about the same: 1,000 configs
#: with intervals 10 to 5,000 (the shipped space) take 0.85 s in blocks of 10 and 1.2 s step by
#: step; with intervals of 2 to 12, stepping those below 4, 8, 12 took 5.9, 4.6, 3.5 s.
BLOCKED_FROM_INTERVAL = 8

#: With ``stop_above``, :func:`replay_many` counts each config's skips and stops those past it
#: once every this many steps (where the blocks' length is chosen again, from the growth
#: intervals of the configs still running).
STOP_CHECK_EVERY = 1024


def limits(amax: np.ndarray) -> np.ndarray:
    """``THRESHOLD / amax`` in float64: step ``t`` overflows at every scale ``>= limits[t]``.

    An inf or NaN gradient overflows at any scale (limit 0); a step without any gradient
    (amax 0) at none (limit inf).
    """
    amax = np.asarray(amax, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = THRESHOLD / amax
    out[~np.isfinite(amax)] = 0.0
    out[amax == 0] = np.inf
    return out


def update_scales(
    found_inf: Sequence[bool],
    *,
    init_scale: float,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
) -> np.ndarray:
    """GradScaler's scale after the ``update()`` of each step, given which steps found an inf
    or NaN: float32, equal to ``scaler._scale`` float for float."""
    scale, good = _f32(init_scale), 0
    out = np.empty(len(found_inf), dtype=np.float32)
    with np.errstate(over="ignore"):
        for t, bad in enumerate(found_inf):
            if bad:
                scale, good = _f32(scale * backoff_factor), 0
            else:
                good += 1
                if good == growth_interval:
                    grown = _f32(scale * growth_factor)
                    scale = grown if math.isfinite(grown) else scale
                    good = 0
            out[t] = scale
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class Replay:
    """What one config's scaler does over a trace."""

    #: The steps it skips (int64 indices, ascending).
    skipped: np.ndarray
    #: The lowest scale it reaches (its initial scale included) and the scale it ends with.
    min_scale: float
    final_scale: float
    #: The scale in effect *during* each step (before that step's update), when asked for.
    scales: np.ndarray | None = None


def replay(
    amax: np.ndarray,
    config: AmpConfig,
    *,
    startup: np.ndarray | None = None,
    per_step: bool = False,
    lag: bool = True,
) -> Replay:
    """GradScaler under ``config`` over the trace ``amax``, step by step (about 50 ms per
    100,000 steps).

    Without ``startup`` the trace is read as it is: step ``t`` sees ``amax[t]``. With it (the
    start-up probe, ``Trace.startup``: one gradient per batch at the initial weights), every
    step while all before it were skipped sees ``startup[t % len(startup)]``. After that, with
    ``lag``, a run that has skipped ``k`` steps has made ``t - k`` updates, and it reads the
    trace where the reference had made about as many on the same batch: at
    ``t - nb * ceil(k / nb)``, ``nb = len(startup)`` being the batches the probe covers (one
    pass of small data); steps that would fall before the trace starts see the probe again.
    That measured best on six workloads (exact start-up streaks on all 30 configs of each, the
    most exact skip counts; a lag of plain ``k``, off the batch phase, was no better than none).
    ``lag=False`` reads ``amax[t]`` after the streak, as :func:`replay_many` does.
    """
    _check(config)
    limit = limits(amax).tolist()
    probe = limits(startup).tolist() if startup is not None and len(startup) else []
    scale = lowest = _f32(config.init_scale)
    growth_at = config.growth_interval - 1
    skipped: list[int] = []
    scales = np.empty(len(limit), np.float32) if per_step else None
    with np.errstate(over="ignore"):
        for t in range(len(limit)):
            if scales is not None:
                scales[t] = scale
            if scale >= (seen_limit(limit, probe, t, len(skipped), lag) if probe else limit[t]):
                scale = _f32(scale * config.backoff_factor)
                lowest = min(lowest, scale)
                growth_at = t + config.growth_interval
                skipped.append(t)
            elif t == growth_at:
                grown = _f32(scale * config.growth_factor)
                scale = grown if math.isfinite(grown) else scale
                growth_at = t + config.growth_interval
    return Replay(np.array(skipped, dtype=np.int64), lowest, scale, scales)


def seen_limit(limit: list[float], probe: list[float], t: int, skips: int, lag: bool) -> float:
    """The overflow limit step ``t`` sees in a run that skipped ``skips`` of the steps before
    it, from the trace's limits and the start-up probe's (see :func:`replay`)."""
    batches = len(probe)
    if skips == t:
        return probe[t % batches]
    if not lag:
        return limit[t]
    read = t - batches * -(-skips // batches)
    return limit[read] if read >= 0 else probe[t % batches]


@dataclasses.dataclass(frozen=True, eq=False)
class ReplayMany:
    """What each of many configs' scalers does over one trace (arrays indexed by config)."""

    n_skipped: np.ndarray
    min_scale: np.ndarray
    final_scale: np.ndarray
    #: Every skipped step, as pairs: config ``skip_config[i]`` skipped step ``skip_step[i]``.
    skip_step: np.ndarray
    skip_config: np.ndarray
    #: The configs stopped early (``replay_many``'s ``stop_above``): their counts are at
    #: least that bound plus one, their skipped steps and scales those up to the stop.
    stopped: np.ndarray

    def skipped(self, config: int) -> np.ndarray:
        """The steps config number ``config`` skips, ascending."""
        order, bounds = self._by_config
        steps: np.ndarray = self.skip_step[order[bounds[config] : bounds[config + 1]]]
        return steps

    @functools.cached_property
    def _by_config(self) -> tuple[np.ndarray, np.ndarray]:
        order = np.lexsort((self.skip_step, self.skip_config))
        bounds = np.searchsorted(self.skip_config[order], np.arange(len(self.n_skipped) + 1))
        return order, bounds


def replay_many(
    amax: np.ndarray,
    configs: Sequence[AmpConfig],
    *,
    startup: np.ndarray | None = None,
    stop_above: int | None = None,
) -> ReplayMany:
    """Every config's GradScaler over the trace ``amax`` at once, exactly as :func:`replay`
    with ``lag=False`` would run each (about a second for 1,000 configs over 100,000 steps).

    With ``stop_above``, a config is stopped once it has skipped more steps than that (checked
    every ``STOP_CHECK_EVERY`` steps): what ranks configs against one whose count is known
    (PyTorch's defaults) needs no more of those that already skip more. The configs still
    running then set the blocks' length, which grows as the short growth intervals, the
    configs that skip most, drop out.

    With ``startup`` the start-up streak is the probe's, as in :func:`replay`; after it the
    trace is read open loop, at ``t``: the order of configs is what a search needs, and the
    streak is where the open loop missed most (exact start-up streaks on codepoints went from
    3 to 30 of 30 configs with the probe).

    Time is cut into blocks of ``B = min(MAX_BLOCK, smallest growth_interval)`` steps, so a
    config grows at most once in a block, and never after an overflow in it (its count then
    restarts, and needs ``growth_interval >= B`` more steps). Per block:

    1. every config takes its growth, if one falls in the block, as if it did not overflow:
       a few vector operations for all of them. One whose largest possible scale there (its
       next rung, if it grows in the block, else its scale) is below the block's smallest
       limit cannot overflow, and is done;
    2. each of the others gets one comparison of the block's limits with its scale profile
       (its scale up to its growth step, the grown one after), which finds its first overflow;
    3. after an overflow the scale only falls, so another in the same block needs the smallest
       limit after it to be at most the new scale (a collapse from a large init_scale, or a
       short interval at its limit), and those configs step from overflow to overflow.

    Configs with ``growth_interval < BLOCKED_FROM_INTERVAL`` go step by step instead.
    """
    configs = list(configs)
    for config in configs:
        _check(config)
    limit = limits(amax)
    probe = limits(startup) if startup is not None and len(startup) else None
    short = np.array([c.growth_interval < BLOCKED_FROM_INTERVAL for c in configs], dtype=bool)
    parts = []
    with np.errstate(over="ignore"):  # a growth past float32's range, which GradScaler refuses
        for stepwise in (True, False):
            chosen = _nonzero(short == stepwise)
            if len(chosen):
                scalers = _Scalers([configs[i] for i in chosen])
                start = 0 if probe is None else _startup_streak(scalers, limit, probe)
                run = _run_stepwise if stepwise else _run_blocked
                every = len(limit) if stop_above is None else STOP_CHECK_EVERY
                for t in range(start, len(limit), every):
                    if stop_above is not None and not scalers.stop_above(stop_above):
                        break
                    run(scalers, limit[: t + every], t)
                parts.append((chosen, scalers))
    return _merged(len(configs), parts)


class _Scalers:
    """Many GradScalers side by side, as arrays over configs (scales in float32, as
    GradScaler holds them): the state :func:`replay_many` advances, and its record of the
    skipped steps. What a step needs is kept up to date; the counts and lowest scales are
    reduced from the record at the end (:meth:`totals`)."""

    def __init__(self, configs: list[AmpConfig]) -> None:
        self.growth = np.array([c.growth_factor for c in configs], dtype=np.float64)
        self.backoff = np.array([c.backoff_factor for c in configs], dtype=np.float64)
        self.interval = np.array([c.growth_interval for c in configs], dtype=np.int64)
        self.scale = np.array([c.init_scale for c in configs], dtype=np.float64).astype(np.float32)
        self.initial = self.scale.copy()
        self.next_growth = self.interval - 1
        self.at: list[np.ndarray] = []
        self.of: list[np.ndarray] = []
        self.to: list[np.ndarray] = []
        # Configs stop (:meth:`stop_above`): the arrays above hold those still running,
        # ``ids`` their numbers; the record numbers them by position until :meth:`_renumber`.
        self.ids = np.arange(len(configs))
        self.final = np.empty(len(configs), dtype=np.float32)
        self.stopped = np.zeros(len(configs), dtype=bool)
        self._counts = np.zeros(len(configs), dtype=np.int64)
        self._renumbered = 0

    def back_off(
        self, which: np.ndarray, steps: np.ndarray | int, in_effect: np.ndarray
    ) -> np.ndarray:
        """Configs ``which`` overflowed at ``steps`` with scales ``in_effect``: their new scale."""
        new: np.ndarray = (in_effect * self.backoff[which]).astype(np.float32)
        self.scale[which] = new
        self.next_growth[which] = steps + self.interval[which]
        self.at.append(np.full(len(which), steps) if isinstance(steps, int) else steps)
        self.of.append(which)
        self.to.append(new)
        return new

    def grown(self, which: np.ndarray | None = None) -> np.ndarray:
        """The scale after the next growth, of every config or of ``which``."""
        scale = self.scale if which is None else self.scale[which]
        return _grown(scale, self.growth if which is None else self.growth[which])

    def grow(self, which: np.ndarray, grown: np.ndarray) -> None:
        self.scale[which] = grown
        self.next_growth[which] += self.interval[which]

    def step(self, t: int, limit: float | np.ndarray) -> np.ndarray:
        """One step for every config, each compared with ``limit`` (one, or one per config);
        the configs that overflowed."""
        over = _nonzero(self.scale >= limit)
        if len(over):
            self.back_off(over, t, self.scale[over])
        due = _nonzero(self.next_growth == t)
        if len(due):
            self.grow(due, self.grown(due))
        return over

    def stop_above(self, most: int) -> int:
        """Stop the configs that have skipped more than ``most`` steps; how many still run."""
        start = self._renumber()
        if start < len(self.of):
            self._counts += np.bincount(self.of[start], minlength=len(self._counts))
        over = self._counts[self.ids] > most
        if over.any():
            gone = self.ids[over]
            self.final[gone], self.stopped[gone] = self.scale[over], True
            keep = ~over
            for name in ("growth", "backoff", "interval", "scale", "next_growth", "ids"):
                setattr(self, name, getattr(self, name)[keep])
        return len(self.ids)

    def _renumber(self) -> int:
        """Number the record's newest entries by config, not by position among those
        running (they were the same until a stop); where those entries now begin."""
        start = self._renumbered
        if start < len(self.of):
            self.of[start:] = [self.ids[np.concatenate(self.of[start:])]]
        self._renumbered = len(self.of)
        return start

    def totals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Skips per config, the lowest scale of each, and the record: steps, configs."""
        self._renumber()
        self.final[self.ids] = self.scale
        of = np.concatenate([np.zeros(0, np.int64), *self.of])
        lowest = self.initial.copy()  # float32, as the record: ufunc.at's fast path
        np.minimum.at(lowest, of, np.concatenate([np.zeros(0, np.float32), *self.to]))
        return (
            np.bincount(of, minlength=len(self.initial)),
            lowest,
            np.concatenate([np.zeros(0, np.int64), *self.at]),
            of,
        )


def _startup_streak(scalers: _Scalers, limit: np.ndarray, probe: np.ndarray) -> int:
    """Step every config while any has skipped every step so far (those see the probe's
    limits, the others the trace's); the first step after."""
    streak = np.ones(len(scalers.scale), dtype=bool)
    for t in range(len(limit)):
        if not streak.any():
            return t
        over = np.zeros_like(streak)
        over[scalers.step(t, np.where(streak, probe[t % len(probe)], limit[t]))] = True
        streak &= over
    return len(limit)


def _run_stepwise(scalers: _Scalers, limit: np.ndarray, start: int) -> None:
    for t in range(start, len(limit)):
        scalers.step(t, limit[t])


def _run_blocked(scalers: _Scalers, limit: np.ndarray, start: int) -> None:
    """Steps ``start`` onwards in blocks (see :func:`replay_many`)."""
    block = min(MAX_BLOCK, int(scalers.interval.min()))
    if start >= len(limit):
        return
    after = _suffix_minima(limit[start:], block)
    positions, rows = np.arange(block), np.arange(len(scalers.scale))
    later = positions[None, :] > positions[:, None]  # row i: the positions after i
    for b, low in enumerate(after[:, 0].tolist()):
        t0 = start + b * block
        window = limit[t0 : t0 + block]
        growth_in_block = scalers.next_growth - t0
        grows = growth_in_block < len(window)
        grown, scale = scalers.grown(), scalers.scale
        # Every config ends the block as if it did not overflow (its growth taken); those
        # that did are put right by _busy_block.
        scalers.scale = np.where(grows, grown, scale)
        scalers.next_growth += scalers.interval * grows
        busy = _nonzero(scalers.scale >= low)
        if len(busy):
            n = len(window)
            _busy_block(
                scalers,
                window,
                t0,
                busy,
                growth_in_block,
                scale,
                grown,
                positions[:n],
                rows[: len(busy)],
                after[b],
                later[:n, :n],
            )


def _suffix_minima(limit: np.ndarray, block: int) -> np.ndarray:
    """Row ``b``, column ``i``: the smallest limit from position ``i`` of block ``b`` to the
    block's end (column 0: the block's smallest; a last column of inf, and inf past the end)."""
    blocks = -(-len(limit) // block)
    flat = np.full(blocks * block, np.inf)
    flat[: len(limit)] = limit
    padded = np.hstack([flat.reshape(blocks, block), np.full((blocks, 1), np.inf)])
    return np.minimum.accumulate(padded[:, ::-1], axis=1)[:, ::-1]


def _busy_block(
    scalers: _Scalers,
    window: np.ndarray,
    t0: int,
    busy: np.ndarray,
    growth_in_block: np.ndarray,
    scale: np.ndarray,
    grown: np.ndarray,
    positions: np.ndarray,
    rows: np.ndarray,
    after: np.ndarray,
    later: np.ndarray,
) -> None:
    """The overflows of the configs ``busy`` in the block at ``t0``, whose scales were
    ``scale`` as it began and ``grown`` after their next growth. (``positions`` and ``rows``:
    ``arange`` over the block and over ``busy``; ``later``: which positions come after each;
    all made once per replay. ``after``: the block's suffix minima.)"""
    profile = np.where(
        positions[None, :] > growth_in_block[busy, None], grown[busy, None], scale[busy, None]
    )
    hit = window[None, :] <= profile
    first = hit.argmax(axis=1)
    overflowed = _nonzero(hit[rows, first])
    if not len(overflowed):
        return
    which, last = busy[overflowed], first[overflowed]
    scale = scalers.back_off(which, t0 + last, profile[overflowed, last])
    again = _nonzero(after[last + 1] <= scale)
    if len(again):
        # Overflow after overflow (no growth can come between): ``after[i]`` is the smallest
        # limit from position ``i`` on, which says who overflows again, and ``remaining[i]``
        # the window with the positions up to ``i`` masked, where each finds its next.
        remaining = np.where(later, window, np.inf)
        while len(again):
            which, last, scale = which[again], last[again], scale[again]
            last = (remaining[last] <= scale[:, None]).argmax(axis=1)
            scale = scalers.back_off(which, t0 + last, scale)
            again = _nonzero(after[last + 1] <= scale)


def _merged(count: int, parts: list[tuple[np.ndarray, _Scalers]]) -> ReplayMany:
    skips, lowest, final = (np.zeros(count, dtype=d) for d in (np.int64, np.float64, np.float64))
    stopped = np.zeros(count, dtype=bool)
    steps, owners = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for chosen, scalers in parts:
        skips[chosen], lowest[chosen], at, of = scalers.totals()
        final[chosen], stopped[chosen] = scalers.final, scalers.stopped
        steps.append(at)
        owners.append(chosen[of])
    return ReplayMany(skips, lowest, final, np.concatenate(steps), np.concatenate(owners), stopped)


def _check(config: AmpConfig) -> None:
    if not config.uses_scaler:
        raise ParameterError(
            "config",
            f"is {config.dtype}, which runs without a loss scaler: "
            "only float16 configs have GradScaler steps to replay",
        )


def _f32(value: float) -> float:
    """``value`` rounded to the nearest float32, as the kernel's ``static_cast<float>`` does
    (inf past float32's range; callers silence numpy's overflow warning)."""
    return float(np.float32(value))


def _nonzero(mask: np.ndarray) -> np.ndarray:
    """The indices where a 1-D ``mask`` holds (``np.flatnonzero`` without its reshaping,
    which costs as much as the work in the blocks of :func:`replay_many`)."""
    return mask.nonzero()[0]


def _grown(scale: np.ndarray, growth: np.ndarray) -> np.ndarray:
    """``float32(scale * growth)`` where finite, else ``scale``: GradScaler never grows to inf.
    (Callers silence numpy's overflow warning.)"""
    new = np.multiply(scale, growth, out=np.empty(len(scale), np.float32), casting="unsafe")
    return np.where(np.isinf(new), scale, new) if math.isinf(new.max(initial=0)) else new
