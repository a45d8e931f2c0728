"""InRunCheck: the real run checks itself against float32 at its own weights, and acts.

Three failures show late, after a search's evidence ends, and each is met where it shows:

- **The precision fails** (bfloat16's 8 significant bits, or float16's 11, stop the fit once
  float32 learns finer detail): the check's losses judge it (:mod:`._gap`). The check then
  tries the modules whose float32 outputs are largest, one at a time, kept in float32 for a
  pass over the step's batch (as the search's late-phase check does at float32's checkpoint),
  and keeps the first that brings the loss back within the tolerance: a float32 island from
  then on. It checks again; a run whose precision fails once more, or that no island helps,
  trains in float32.
- **The forward overflows late** (an activation past float16's 65504 that the search never
  saw): the step's loss is not finite where float32's is, or a loss that was not finite since
  the last read-back made the check look at the next step's forward. The modules whose own
  computation turned finite inputs into non-finite outputs are kept in float32 (more rounds
  while the forward stays non-finite; on a batch that does not overflow, the module whose
  outputs come nearest float16's range), and the loss scale is put back where it was before
  the overflow instead of collapsing.
- **The scaler leaves its prediction** (the watch): the run's own gradients are recorded for
  a while and the scaler's knobs chosen again by replaying them (:mod:`._knobs`), set in
  place.

The policy (act, warn or stop) is the result file's ``check`` block. Every check is kept (at
most ``KEPT_CHECKS``, thinned evenly beyond), every action too, and both go into
``amp.state_dict()``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from scalertune._amp._check import CheckPolicy
from scalertune._amp._runtime import AmpRuntime
from scalertune._amp._watch import ScalerPrediction
from scalertune._inrun._account import describe
from scalertune._inrun._actions import (
    Actions,
    float8_spoils,
    forward_overflows,
    precision_fails,
    scaler_drifted,
)
from scalertune._inrun._gap import Check, judge
from scalertune._inrun._knobs import KnobRecording
from scalertune._inrun._lines import LOGGER, Action, heading, stop, warn
from scalertune._inrun._passes import Passes, loss_value, over_ranks
from scalertune._inrun._replicas import Copies
from scalertune._inrun._run_record import KEPT_CHECKS, Predicted, RunRecord


class Lookout:
    """When the check looks at the next step's forward for an overflow, and the scale it puts
    back after one: a loss that was not finite since the last read-back asks once (until a
    read of finite losses), a collapsing scale once a collapse (:meth:`InRunCheck.rescue`)."""

    def __init__(self) -> None:
        self.requested = self._asked = False  # requested: read on every step
        self.healthy: float | None = None  # the scale at the last read of finite losses
        #: The step the guard would have stopped the run at, while the check looks first.
        self._rescue_at: int | None = None

    def state(self) -> list[Any]:
        """What a checkpoint keeps: a request not yet taken, and the guard's step."""
        return [self.requested, self._asked, self._rescue_at]

    def restore(self, state: Sequence[Any] | None) -> None:
        if state is not None:
            requested, asked, rescue_at = state
            self.requested, self._asked = bool(requested), bool(asked)
            self._rescue_at = None if rescue_at is None else int(rescue_at)

    def take(self) -> bool:
        """Whether this step's forward is looked at (a request is taken once)."""
        suspect, self.requested = self.requested, False
        return suspect

    def read(self, scale: float, *, bad_loss: bool) -> None:
        """A read-back: note the scale while the losses are finite; after a loss that was not,
        ask for the next step's forward."""
        if not bad_loss:
            self.healthy, self._asked = scale, False
        elif not self._asked:
            self.requested = self._asked = True

    def collapsed(self, step: int) -> None:
        """The guard is about to stop the run at ``step``: ask for the next step's forward."""
        self.requested, self._rescue_at = True, step
        LOGGER.info(
            "%s: the loss scale collapsed: looking at the next forward before the guard stops "
            "the run",
            heading(step),
        )

    def scale_back(self, init_scale: float) -> tuple[float | None, bool]:
        """An overflow is looked for: the scale to put back, and whether the scale collapsed
        (then back to where it began: ``init_scale`` at least). A collapse is looked at once."""
        healthy, collapsed = self.healthy, self._rescue_at is not None
        if collapsed:
            healthy = max(healthy or 0.0, init_scale)
        self._rescue_at = None
        return healthy, collapsed


def thinned(checks: list[Check], every: int) -> list[Check]:
    """``checks``, or past ``KEPT_CHECKS`` the older ones thinned evenly over the run (the
    recent quarter kept whole): those on a grid of every ``2**k``-th check (of a run that
    checks every ``every`` steps), ``k`` as small as leaves room for as many again. The grid
    only coarsens, so that where the gap opened stays in the record however long the run."""
    if len(checks) <= KEPT_CHECKS:
        return checks
    recent = KEPT_CHECKS // 4
    older = kept = checks[:-recent]
    stride = 1
    while len(kept) > (KEPT_CHECKS - recent) // 2 and stride < 2**40:
        stride *= 2
        kept = [c for c in older if (c.step // max(every, 1)) % stride == 0]
    return kept + checks[-recent:]


def log_check(check: Check) -> None:
    """The check's line in the debug log."""
    LOGGER.debug(
        "%s: loss %.6g, float32 %.6g at the same weights (%.4gx)",
        heading(check.step),
        check.ours,
        check.float32,
        check.ratio,
    )


class InRunCheck:
    """The in-run check of one run (see the module's docstring); the runtime calls it."""

    def __init__(
        self,
        policy: CheckPolicy | None = None,
        *,
        prediction: ScalerPrediction | None = None,
        sink: Callable[[RunRecord], None] | None = None,
        origin: Mapping[str, Any] | None = None,
    ) -> None:
        self.policy = policy or CheckPolicy()
        #: The result file's contents the policy and prediction were read from (``None``
        #: without one): its ``evidence`` names the study the run's record goes to.
        self.origin = origin
        self._every = self.policy.every  # read on every step: a plain attribute
        self.prediction = prediction
        #: Called with :meth:`summary` after each check and action (the study's copy).
        self.sink = sink
        self.checks: list[Check] = []
        self.actions = Actions(self.policy)
        self._window: list[Check] = []  # the checks since the last action
        self._lookout = Lookout()  # when to look at the next forward for an overflow
        self._knobs = KnobRecording()
        self._copies = Copies()  # on ranks: one model, or a copy each

    @property
    def recording(self) -> bool:
        """Whether it records the run's gradients now (to choose the scaler's knobs)."""
        return self._knobs.trace is not None

    def due(self, steps: int) -> bool:
        return steps % self._every == 0 or self._lookout.requested

    def run(
        self,
        amp: AmpRuntime,
        closure: Callable[[], Any],
        recompute: Callable[[], Any],
        autocast: bool,
    ) -> Any:
        """The step's forward, then the check's: see the module's docstring."""
        suspect = self._lookout.take()
        passes = Passes(amp, recompute, autocast=autocast)
        if autocast:
            with amp.autocast():
                output = closure()
        else:
            output = closure()
        if output is None:  # a training_step that skips its batch: nothing to check
            return output
        ours = loss_value(output).detach().float()
        ours_now, float32 = over_ranks(torch.stack([ours, passes.float32()]), amp.device)
        check = Check(amp.steps, ours_now, float32)
        self._keep(check)
        if (line := self._copies.look(amp.models, amp.steps)) is not None:
            warn(line)
        acted = len(self.actions.done)
        overflowed = not math.isfinite(ours_now) and math.isfinite(float32)
        if overflowed or suspect:
            healthy, collapsed = self._lookout.scale_back(amp.config.init_scale)
            forward_overflows(self.actions, amp, passes, check, healthy, collapsed=collapsed)
        elif amp.config.float8 and float8_spoils(self.actions, amp, passes, check):
            pass  # a layer float8 spoils now: acted on at once, the window waits for none
        elif len(self._window) >= self.policy.window:
            gap = judge(self._window[-self.policy.window :])
            if gap is not None and gap.beyond(self.actions.tolerance(), self.policy.z):
                precision_fails(self.actions, amp, passes, check, gap)
        if len(self.actions.done) > acted:
            self._window.clear()  # the evidence of the config that was
        self._publish(amp)
        return output

    def on_read(self, amp: AmpRuntime, *, scale: float, bad_loss: bool) -> bool:
        """At a read-back: note the scale while the losses are finite; after a loss that was
        not, look at the next step's forward; set the knobs once their gradients are in
        (then True: the scaler changed)."""
        self._lookout.read(scale, bad_loss=bad_loss)
        chosen = self._knobs.chosen(amp.config, scale)
        if chosen is None:
            return False
        scaler_drifted(self.actions, amp, *chosen)
        self._window.clear()
        return True

    def rescue(self, amp: AmpRuntime) -> bool:
        """The guard is about to stop the run (the scale under its floor, or too many skipped
        steps in a row): acting, look at the next step's forward first, once a collapse; an
        overflow found there gets its island and the scale back (the config's initial one at
        least), and the guard stands down. Where nothing is found, the guard's next read-back
        stops the run as it would have (the read-back asks once a collapse)."""
        if self.policy.action != "act":
            return False
        self._lookout.collapsed(amp.steps)
        return True

    def on_drift(self, amp: AmpRuntime, found: str) -> None:
        """The watch found the scaler off its prediction: record the gradients (act), or
        stop."""
        if self.policy.action == "stop":
            raise stop(
                f"{heading(amp.steps)}: the loss scaler left the search's prediction: {found}"
            )
        self._knobs.start(amp.steps, found)

    def record(self, amp: AmpRuntime, optimizer: torch.optim.Optimizer) -> None:
        self._knobs.record(amp, optimizer)

    def _keep(self, check: Check) -> None:
        self.checks.append(check)
        self._window.append(check)
        del self._window[: -self.policy.window]
        self.checks = thinned(self.checks, self._every)
        log_check(check)

    def _publish(self, amp: AmpRuntime) -> None:
        if self.sink is not None:
            self.sink(self.summary(amp))

    def summary(self, amp: AmpRuntime) -> RunRecord:
        """The run's record: the policy, the config now, every check kept, every action, and
        the scaler's story beside the search's prediction (what the study shows and
        :meth:`report` prints)."""
        return RunRecord(
            policy=self.policy,
            config=amp.config,
            steps=amp.steps,
            skipped_steps=amp.skipped_steps,
            checks=tuple(self.checks),
            actions=tuple(self.actions.done),
            scale=float(amp.scale) if amp.config.uses_scaler else None,
            prediction=None if self.prediction is None else Predicted.of(self.prediction),
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "checks": [c.to_list() for c in self.checks],
            "window": [c.to_list() for c in self._window],
            "actions": self.actions.to_list(),
            "healthy": self._lookout.healthy,
            # a forward asked for (after a non-finite loss, or before the guard stops the
            # run) is still looked at after a resume
            "lookout": self._lookout.state(),
            # a run resumed in the middle of recording its gradients goes on, and chooses
            "recording": self._knobs.state(),
            # a resumed run goes on writing the study's record of the run it resumes
            "run": of_run() if (of_run := getattr(self.sink, "of_run", None)) else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.checks = [Check(int(s), float(o), float(f)) for s, o, f in state.get("checks", [])]
        self._window = [Check(int(s), float(o), float(f)) for s, o, f in state.get("window", [])]
        self.actions.done = [Action.from_dict(a) for a in state.get("actions", [])]
        self._lookout.healthy = state.get("healthy")
        self._lookout.restore(state.get("lookout"))
        self._knobs.restore(state.get("recording"))
        adopt = getattr(self.sink, "adopt", None)
        if adopt is not None:
            adopt(state.get("run"))

    def report(self, amp: AmpRuntime) -> str:
        """What ``amp.report()`` prints (see :meth:`summary`)."""
        return describe(self.summary(amp))
