"""What the in-run check does when the precision or the scaler fails, by the policy: each
action changes the runtime in place (:meth:`~scalertune.AmpRuntime.reconfigure`), says one
line, and restarts the watch's count from it."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from scalertune._amp._check import CheckPolicy
from scalertune._amp._config import FLOAT8_RECIPES, AmpConfig
from scalertune._amp._guard import AmpGuardError
from scalertune._amp._runtime import AmpRuntime
from scalertune._amp._watch import ScalerPrediction
from scalertune._inrun._culprits import ISLAND_CLOSES, island_for, overflow_islands
from scalertune._inrun._float8_layers import LAYER_ERROR
from scalertune._inrun._gap import Check, Gap, relative
from scalertune._inrun._knobs import Knobs
from scalertune._inrun._lines import LOGGER, Action, heading, say, scale_text, stop
from scalertune._inrun._passes import Passes, over_ranks


class Actions:
    """The actions of one run, by its policy: what was done, at which step, and why."""

    def __init__(self, policy: CheckPolicy) -> None:
        self.policy = policy
        self.done: list[Action] = []

    def acting(self, amp: AmpRuntime, found: str) -> bool:
        """Whether the policy acts; under ``warn`` say ``found`` (nothing changes, so it is
        said again while it lasts), under ``stop`` raise."""
        if self.policy.action == "stop":
            raise stop(found)
        if self.policy.action == "warn":
            self.acted(amp, "none", f"{found} (policy 'warn': nothing changed)")
            return False
        return True

    def acted(
        self, amp: AmpRuntime, kind: str, line: str, *, prediction: ScalerPrediction | None = None
    ) -> None:
        """Keep and say the action; the watch counts from here (against ``prediction``, the
        new knobs', where given)."""
        action = Action(step=amp.steps, kind=kind, line=line)
        self.done.append(action)
        say(action)
        if amp.readback is not None and kind != "none":
            amp.readback.rebase(prediction, steps=amp.steps, skipped=amp.skipped_steps)

    def islanded(self) -> bool:
        """Whether the check kept a module in float32 for the precision (``island``; one kept
        for a forward overflow is ``overflow``)."""
        return any(a.kind == "island" for a in self.done)

    def tolerance(self) -> float:
        """The gap the checks allow: the policy's ``tolerance``, or after an island for the
        precision, the share of float32's loss that island claimed to bring the batch within
        (a policy stricter than that stays as strict)."""
        if self.islanded():
            return min(ISLAND_CLOSES, self.policy.tolerance)
        return self.policy.tolerance

    def float32(self, amp: AmpRuntime, line: str) -> None:
        amp.reconfigure(AmpConfig(dtype="float32", clip_norm=amp.config.clip_norm))
        self.acted(amp, "float32", line)

    def to_list(self) -> list[dict[str, Any]]:
        return [a.to_dict() for a in self.done]


def precision_fails(
    actions: Actions, amp: AmpRuntime, passes: Passes, check: Check, gap: Gap
) -> None:
    """The precision fails over recent checks: an island that closes the gap, else float32
    (also when the run's own island was not enough)."""
    found = (
        f"{heading(check.step)}: {amp.config.dtype}'s loss is {gap.describe()} at the same "
        f"weights, beyond the rule of {1 + actions.tolerance():.3g}x and {actions.policy.z:g} "
        "standard errors"
    )
    if not actions.acting(amp, found):
        return
    float8 = amp.config.float8
    if float8 and float8_moved(actions, amp, passes, check, found, recipes(amp.config)):
        return
    ours = actions.islanded()
    best = None if ours else island_for(amp, passes, check)
    enough = best is not None and best[1] <= 1 + ISLAND_CLOSES
    if not enough and float8 and float8_moved(actions, amp, passes, check, found, [BFLOAT16]):
        return
    if best is None or not enough:
        why = (
            f"its float32 island was not enough (it held the step's batch within "
            f"{ISLAND_CLOSES:.0%} of float32's loss)"
            if ours
            else "no module kept in float32 brings this batch's loss back"
            + (f" (the best, {best[0]!r}, leaves it at {best[1]:.3g}x)" if best else "")
        )
        actions.float32(amp, f"{found}: {why}; training in float32 from now on")
        return
    name, with_it = best
    amp.reconfigure(dataclasses.replace(amp.config, fp32_modules=(*amp.config.fp32_modules, name)))
    actions.acted(
        amp,
        "island",
        f"{found}: keeping {name!r} in float32 from now on (this batch's loss "
        f"{with_it:.3g}x float32's with it, {check.ratio:.3g}x without)",
    )


def float8_spoils(actions: Actions, amp: AmpRuntime, passes: Passes, check: Check) -> bool:
    """A layer float8 spoils now, on this check's batch (its output far off float32's, its
    inputs flushed to zero: ``_float8_layers``), acted on at once: a more accurate recipe that
    brings the worst back, else every spoiled layer kept out of float8; ``False`` when none
    is spoiled.

    The loss at the same weights alone misses it: a run goes on learning around a layer that
    float8 silences (measured: nanoGPT with one activation grown past 1e5 read 5.3x float32's
    at the step it came, then 0.02x, its weights fitted to the silent layer, and ended 1.58x
    float32's loss, unchecked and checked alike)."""
    configs = [amp.config, *(_moved(amp.config, r) for r in recipes(amp.config))]
    casts = passes.float8_casts(configs)
    errors = [_agreed({c.name: c.error for c in found}, amp) for found in casts]
    islands = passes.in_float32()
    spoiled = {n: e for n, e in errors[0].items() if e > LAYER_ERROR and n not in islands}
    if not spoiled:
        return False
    name = max(spoiled, key=lambda n: spoiled[n])
    found = f"{heading(check.step)}: " + next(c.line() for c in casts[0] if c.name == name)
    if not actions.acting(amp, found):
        return True
    for config, moved in zip(configs[1:], errors[1:]):
        if moved.get(name, math.inf) <= LAYER_ERROR:
            amp.reconfigure(config)
            actions.acted(
                amp,
                "recipe",
                f"{found}; training with float8's {config.float8_recipe} recipe from now on "
                f"(the layer's output {moved[name]:.0%} off float32's with it)",
            )
            return True
    # no recipe brings it back: every layer float8 spoils now is kept out at once (one check
    # each would leave the others silenced until theirs)
    others = sorted((n for n in spoiled if n != name), key=lambda n: -spoiled[n])
    kept = [name, *others]
    also = "".join(f"; so is {n!r} ({spoiled[n]:.0%} off)" for n in others)
    amp.reconfigure(dataclasses.replace(amp.config, fp32_modules=(*amp.config.fp32_modules, *kept)))
    actions.acted(
        amp,
        "island",
        f"{found}{also}; keeping {', '.join(map(repr, kept))} out of float8 (in float32) "
        "from now on",
    )
    return True


def _agreed(errors: dict[str, float], amp: AmpRuntime) -> dict[str, float]:
    """Each layer's error, the mean over the ranks (every rank decides alike)."""
    names = list(errors)
    return dict(zip(names, over_ranks([errors[n] for n in names], amp.device))) if names else {}


#: The last move of a failing float8 run before float32: bfloat16 autocast, out of float8.
BFLOAT16 = "bfloat16"


def float8_moved(
    actions: Actions,
    amp: AmpRuntime,
    passes: Passes,
    check: Check,
    found: str,
    moves: list[str],
) -> bool:
    """float8 fails: the first of ``moves`` (a more accurate recipe, or :data:`BFLOAT16`) that
    brings this batch's loss within ``ISLAND_CLOSES`` of float32's, set in place; ``False``
    when none does.

    A recipe comes before a layer kept out of float8: an outlier row that spoils a tensorwise
    scale passes on to the next layers' inputs as it grows (measured: the first layer kept
    out brought the batch to 0.98x float32's at step 2,700 of a growing outlier, and the run
    still ended 1.18x behind), where a scale per row keeps it to its own row in every layer.
    """
    tried = []
    for move in moves:
        config = _moved(amp.config, move)
        (ours,) = over_ranks([float(passes.under(config))], amp.device)
        with_it = relative(ours, check.float32)
        words = f"float8's {move} recipe" if move != BFLOAT16 else "bfloat16, out of float8"
        tried.append(f"{words} {with_it:.3g}x")
        if with_it <= 1 + ISLAND_CLOSES:
            amp.reconfigure(config)
            actions.acted(
                amp,
                "recipe" if move != BFLOAT16 else BFLOAT16,
                f"{found}: training with {words} from now on (this batch's loss "
                f"{with_it:.3g}x float32's with it, {check.ratio:.3g}x without)",
            )
            return True
    LOGGER.info("%s: not enough: %s", found, ", ".join(tried))
    return False


def recipes(config: AmpConfig) -> list[str]:
    """The float8 recipes more accurate than ``config``'s, in order (per row; per row with the
    weight gradient in high precision, which runs around float32 only)."""
    later = FLOAT8_RECIPES[FLOAT8_RECIPES.index(config.float8_recipe) + 1 :]
    return [r for r in later if r != "rowwise_with_gw_hp" or config.float8_around == "float32"]


def _moved(config: AmpConfig, move: str) -> AmpConfig:
    if move == BFLOAT16:
        return AmpConfig(
            dtype="bfloat16", clip_norm=config.clip_norm, fp32_modules=config.fp32_modules
        )
    return dataclasses.replace(config, float8_recipe=move, float8_round_scales=None)


def forward_overflows(
    actions: Actions,
    amp: AmpRuntime,
    passes: Passes,
    check: Check,
    healthy: float | None,
    *,
    collapsed: bool = False,
) -> None:
    """A forward overflow, this step's or (``check`` finite) one since the last read: the
    modules at fault kept in float32, and the scale put back to ``healthy`` (the scale
    before the overflow), else float32. Where the scale ``collapsed`` (the guard is about to
    stop the run) and the forward is finite with nothing at fault, the gradients were too
    large for float16, not an activation: the scale is set back (:func:`scale_set_back`)."""
    dtype = amp.config.dtype
    found = (
        f"{heading(check.step)}: {dtype}'s loss was not finite since the last read-back"
        if math.isfinite(check.ours)
        else f"{heading(check.step)}: {dtype}'s forward overflows (its loss is "
        f"{check.ours:.4g} where float32's at the same weights is {check.float32:.4g})"
    )
    islands, how = overflow_islands(amp, passes, finite=math.isfinite(check.ours))
    if islands:  # a module kept in float32 already is no new island
        in_float32 = passes.in_float32()
        islands = [m for m in islands if m not in in_float32] or None
        how = how if islands else f"{how}, kept in float32 already"
    if islands is None:
        if collapsed and math.isfinite(check.ours):
            scale_set_back(actions, amp, check, healthy, how)
            return
        LOGGER.info("%s, but nothing points at the forward: %s", found, how)
        return
    if not actions.acting(amp, found):
        return
    if not islands:
        actions.float32(amp, f"{found}: {how}; training in float32 from now on")
        return
    now = float(amp.scale)
    restore = healthy if healthy is not None and healthy > now else None
    config = dataclasses.replace(amp.config, fp32_modules=(*amp.config.fp32_modules, *islands))
    amp.reconfigure(config, scale=restore)
    kept = (
        f" and the loss scale at {scale_text(restore)} (before the overflow), not {scale_text(now)}"
        if restore is not None
        else ""
    )
    them = "it" if len(islands) == 1 else "them"
    actions.acted(amp, "overflow", f"{found}: {how}; keeping {them} in float32 from now on{kept}")


#: How many times a run's collapsed scale is set back before the guard stops it: a burst of
#: large gradients passes (a few bad batches, a spike of the learning rate), and each setback
#: costs the ~40 skipped steps of another collapse from 2**16; one that returns three times is
#: not a burst, and no setting of the scale fixes it.
SCALE_SET_BACKS = 3


def scale_set_back(
    actions: Actions, amp: AmpRuntime, check: Check, healthy: float | None, how: str
) -> None:
    """The loss scale collapsed under the guard's floor while the forward stays finite with
    no module at fault: gradients too large for float16 at every scale for a while (a burst
    of large losses), not an activation overflow. Once the burst is over (this forward is
    finite), the scale goes back to ``healthy`` (where it was before, the config's initial
    scale at least), said in one line; once it was set back ``SCALE_SET_BACKS`` times, the
    next collapse stops the run with what was seen."""
    now = float(amp.scale)
    floor = amp.guard.min_scale if amp.guard is not None else 0.0
    if healthy is None or healthy <= max(now, floor):  # no higher scale to go back to
        LOGGER.info(
            "%s: the scale is not under where it was: the guard decides", heading(amp.steps)
        )
        return
    seen = (
        f"{heading(check.step)}: the loss scale fell to {scale_text(now)} ("
        f"{amp.skipped_steps:,} steps skipped so far) while the forward stays finite at the "
        "same weights "
        f"({check.ratio:.3g}x float32's loss; {how}): the gradients, not an activation, were "
        "too large for float16"
    )
    setbacks = sum(a.kind == "scale" for a in actions.done)
    if amp.engine is not None or setbacks >= SCALE_SET_BACKS:
        again = f"; set back {setbacks} times, it collapsed again" if setbacks else ""
        raise AmpGuardError(
            f"{seen}{again}: lower the learning rate or clip the gradients (clip_norm), or "
            "train in bfloat16"
        )
    amp.reconfigure(amp.config, scale=healthy)
    actions.acted(
        amp, "scale", f"{seen}; the scale set back to {scale_text(healthy)}, where it was before"
    )


def scaler_drifted(actions: Actions, amp: AmpRuntime, knobs: Knobs, drift: str) -> None:
    """The scaler left its prediction (``drift``): the knobs the replay of the run's own
    gradients chose, set in place; where they are the run's own and restarting the scale
    does no better than the scale now, nothing changes (said in the log, not as an action)
    and the watch follows the replay from here."""
    old = amp.config
    changed = [
        f"{label} {getattr(knobs.config, k):g} (was {getattr(old, k):g})"
        for k, label in (
            ("growth_interval", "growth every"),
            ("growth_factor", "growth factor"),
            ("backoff_factor", "backoff"),
        )
        if getattr(knobs.config, k) != getattr(old, k)
    ]
    as_good = knobs.skipped >= knobs.own_skipped and round(knobs.own_headroom) >= round(
        knobs.headroom
    )
    if not changed and as_good:  # the run's own knobs do as well from where the scale is
        LOGGER.info(
            "%s: the loss scaler left the search's prediction (%s); replayed over the run's "
            "own last %d steps of gradients, its knobs from the scale now do as well as any "
            "(skip %d, %.1f powers of two under the overflow limit): kept, and watched "
            "against that replay from here",
            heading(amp.steps),
            drift,
            knobs.steps,
            knobs.own_skipped,
            knobs.own_headroom,
        )
        if amp.readback is not None:
            amp.readback.rebase(knobs.prediction, steps=amp.steps, skipped=amp.skipped_steps)
        return
    amp.reconfigure(knobs.config, scale=knobs.scale)
    actions.acted(
        amp,
        "knobs",
        f"{heading(amp.steps)}: the loss scaler left the search's prediction ({drift}); "
        f"replayed over the run's own last {knobs.steps} steps of gradients, restarting at "
        f"scale {scale_text(knobs.scale)}"
        + (f" with {', '.join(changed)}" if changed else "")
        + f" skips {knobs.skipped} of them, {knobs.headroom:.1f} powers of two under the "
        f"overflow limit, where its knobs from the scale now skip {knobs.own_skipped}, "
        f"{knobs.own_headroom:.1f} under: set in place",
        prediction=knobs.prediction,
    )
