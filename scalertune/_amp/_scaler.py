"""The GradScaler the runtime builds, and how it knows which steps were skipped.

GradScaler decides every step: ``scaler.step(optimizer)`` unscales the gradients, and calls
``optimizer.step()`` only when all of them are finite; ``scaler.update()`` then backs the
scale off (a *skipped step*) or counts one more finite step towards its growth. Whoever calls
the two (the runtime's own :meth:`~scalertune.AmpRuntime.step`, Accelerate's prepared
optimizer, Lightning's precision plugin), :class:`RuntimeScaler` tells the runtime about
each step once ``update()`` has decided it, so the skipped steps, the guard and the watch
are the framework's own steps, with no extra call in its loop.

How a step is known to be skipped, without waiting for the device more than GradScaler does
(:class:`Skips`): for an ordinary optimizer, GradScaler reads the inf/NaN flag on the host
(its one sync per step) and an optimizer step post-hook that did not fire *is* a skipped
step. Until one step has been seen to run, the hook is checked against the scale (one read
per step of the start-up), so an optimizer whose hooks never fire cannot pass for one that
skips every step. An optimizer that applies the flag itself (``_step_supports_amp_scaling``:
fused Adam, AdamW, SGD) is always called and skips inside its kernel, so the host never
learns; there the scale tells: ``update()`` multiplies it by ``backoff_factor < 1`` exactly
when the step was skipped, and that comparison stays on the device.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from scalertune._amp._config import AmpConfig
from scalertune._amp._torch_private import (
    live_scale,
    optimizer_states,
    restart_growth,
    start_at,
    switch_off,
    switch_on,
)
from scalertune._amp._watch import STARTUP_GAP
from scalertune._errors import UsageError


class StepListener(Protocol):
    """What a :class:`RuntimeScaler` tells: a loss is scaled (``scaler.scale``), a step
    begins (``scaler.step``), a step is decided (``scaler.update``)."""

    def scaler_scaling(self, loss: torch.Tensor) -> None: ...
    def scaler_stepping(self, optimizer: torch.optim.Optimizer) -> None: ...
    def scaler_updated(self) -> None: ...


class _Reporting:
    """What a runtime's scaler adds to its GradScaler class: it tells its listener about every
    step it takes and every update, and is that class in every number."""

    def __init__(self, device: str, *, listener: StepListener, **kwargs: Any) -> None:
        super().__init__(device, **kwargs)  # type: ignore[call-arg]
        self._listener = listener
        #: Whether it scales and steps (GradScaler's ``is_enabled``, kept here as a plain
        #: attribute: read twice a step, and changed only by :meth:`switch_off` and
        #: :meth:`switch_on`).
        self._enabled_here = bool(super().is_enabled())  # type: ignore[misc]
        # Made enabled, it reports every update, also after :meth:`switch_off` (the in-run
        # check's float32: the steps it passes through are the run's steps); an update that
        # only sets the scale in place (:meth:`set_scale`) is no step.
        self._reports, self._quiet = self._enabled_here, False

    def scale(self, outputs: Any) -> Any:
        if self._enabled_here and isinstance(outputs, torch.Tensor):
            self._listener.scaler_scaling(outputs)
        return super().scale(outputs)  # type: ignore[misc]

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        if self._enabled_here:
            self._listener.scaler_stepping(optimizer)
        return super().step(optimizer, *args, **kwargs)  # type: ignore[misc]

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        super().update(new_scale)  # type: ignore[misc]
        if self._reports and not self._quiet:
            self._listener.scaler_updated()

    def set_scale(self, scale: float) -> None:
        """Set the scale in place between steps (``update(new_scale)``), reporting no step;
        the next growth comes ``growth_interval`` clean steps later, as after any change of
        the scale (the in-run check's replay of the knobs starts there)."""
        self._quiet = True
        try:
            self.update(new_scale=float(scale))
        finally:
            self._quiet = False
        restart_growth(self)  # type: ignore[arg-type]

    def switch_on(self) -> bool:
        """Enable it again after :meth:`switch_off` (a run rolled back to a checkpoint from
        before its fall back to float32); whether it could: only one made enabled can."""
        if not self._reports:
            return False
        switch_on(self)  # type: ignore[arg-type]
        self._enabled_here = True
        return True

    def switch_off(self) -> None:
        """Disable it (until :meth:`switch_on`): ``scale`` returns the loss as it is,
        ``step`` steps; each update it passes through is still reported."""
        switch_off(self)  # type: ignore[arg-type]
        self._enabled_here = False


class RuntimeScaler(_Reporting, torch.amp.GradScaler):
    """A GradScaler that tells its runtime about every step it takes and every update.

    It is GradScaler in every number: the subclass only reports. Frameworks take it where they
    take a GradScaler (``MixedPrecision(..., scaler=...)``, ``Accelerator.scaler``).

    Which scaler a wrapper needs: a model, DDP and FSDP2 (``fully_shard``) take GradScaler
    (DDP's gradients are all-reduced before the scaler reads them; FSDP2 all-reduces
    ``found_inf`` over the mesh itself). FSDP1 (``FullyShardedDataParallel``) needs
    ``ShardedGradScaler``, which all-reduces ``found_inf`` over the shards: with a plain
    GradScaler each rank skips on its own shard's gradients and the scales drift apart.
    The runtime takes :func:`sharded_scaler` for an FSDP1 model (:func:`scaler_class`).
    """


@functools.cache
def sharded_scaler() -> type[torch.amp.GradScaler]:
    """:class:`RuntimeScaler` over ``ShardedGradScaler`` (made on first use: importing FSDP
    costs a second, paid only by a program that has an FSDP1 model)."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    class ShardedRuntimeScaler(_Reporting, ShardedGradScaler):
        """``ShardedGradScaler`` that reports to its runtime, as :class:`RuntimeScaler`."""

    return ShardedRuntimeScaler


def scaler_class(model: torch.nn.Module) -> type[torch.amp.GradScaler]:
    """The scaler ``model`` needs: :func:`sharded_scaler` when a module of it is
    FSDP1-wrapped, :class:`RuntimeScaler` otherwise (see its docstring)."""
    if "torch.distributed.fsdp" not in sys.modules:  # no FSDP1 model exists in this process
        return RuntimeScaler
    from torch.distributed.fsdp import FullyShardedDataParallel

    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return sharded_scaler()
    return RuntimeScaler


def set_knobs(
    scaler: torch.amp.GradScaler, config: AmpConfig | None, *, scale: float | None = None
) -> None:
    """Change a runtime's scaler in place, between steps: ``config``'s growth factor, backoff
    factor and growth interval (GradScaler's own setters) and, where given, the scale (its
    ``update(new_scale)``, which is no step); ``config=None`` disables it (float32: ``scale``
    returns the loss as it is, ``step`` steps the optimizer, and the runtime counts each
    update it passes through as a step taken) until a config with a scaler enables it again
    (a rollback to a checkpoint from before); a scaler made disabled refuses that config."""
    if not isinstance(scaler, _Reporting):
        raise TypeError(f"{type(scaler).__name__} is not a runtime's scaler (RuntimeScaler)")
    if config is None:
        scaler.switch_off()
        return
    if not scaler.is_enabled() and not scaler.switch_on():
        raise UsageError(
            f"this runtime was made without a loss scaler, so it cannot train {config.dtype} "
            "with one: make a new AmpRuntime (or scalertune.load) for this config"
        )
    scaler.set_growth_factor(config.growth_factor)
    scaler.set_backoff_factor(config.backoff_factor)
    scaler.set_growth_interval(config.growth_interval)
    if scale is None:
        return
    if live_scale(scaler) is None:  # no step yet: the scale is made from init_scale
        start_at(scaler, scale)
    else:
        scaler.set_scale(scale)


def grads_unscaled(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``scaler.unscale_(optimizer)`` ran this step already (clipping does it before
    ``scaler.step``): the gradients then hold their true values, not ``scale`` times them."""
    from torch.amp.grad_scaler import OptState

    states = optimizer_states(scaler)
    state = states.get(id(optimizer)) if isinstance(states, dict) else None
    return state is not None and state.get("stage") is OptState.UNSCALED


class Taken:
    """An optimizer step post-hook: counts the optimizer steps that really ran."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, *_: Any) -> None:
        self.count += 1


class DeviceStep:
    """Whether a fused optimizer's step was applied, as a device flag: ``bool()`` reads it
    (one transfer), and nothing is read unless asked."""

    __slots__ = ("_skipped",)

    def __init__(self, skipped: torch.Tensor) -> None:
        self._skipped = skipped

    def __bool__(self) -> bool:
        return not bool(self._skipped)

    def __repr__(self) -> str:
        return "DeviceStep(read with bool())"


class Modes:
    """How each optimizer's skips are known (see the module's docstring): "verify" (the
    post-hook, checked against the scale until it has heard a step), "host" (the post-hook) or
    "device" (the scale). Every hooked optimizer shares one post-hook, :attr:`taken`, removed
    when this is collected."""

    def __init__(self) -> None:
        self.taken = Taken()
        self._known: dict[int, tuple[torch.optim.Optimizer, str]] = {}

    def of(self, optimizer: torch.optim.Optimizer) -> str:
        """``optimizer``'s mode, found on its first step (its post-hook registered then)."""
        known = self._known.get(id(optimizer))
        if known is None or known[0] is not optimizer:
            fused = getattr(optimizer, "_step_supports_amp_scaling", False)
            hooks = hasattr(optimizer, "register_step_post_hook")
            mode = "verify" if hooks and not fused else "device"
            if mode == "verify":
                weakref.finalize(self, optimizer.register_step_post_hook(self.taken).remove)
            known = self._known[id(optimizer)] = (optimizer, mode)
        return known[1]

    def verified(
        self, optimizer: torch.optim.Optimizer, backed_off: bool, hook_silent: bool
    ) -> None:
        """A "verify" step, counted by the scale: trust the hook from the first step it ran and
        the hook heard it, and never if the two disagree."""
        mode = "device" if backed_off != hook_silent else "verify" if backed_off else "host"
        self._known[id(optimizer)] = (optimizer, mode)


class BadLosses:
    """The losses of the steps not yet decided, and whether one was inf or NaN (see
    :meth:`Skips.note_loss`): known on the host (:meth:`seen`) where a skipped step was
    decided there, else in :attr:`flag`, a device flag read with the scale."""

    def __init__(self) -> None:
        self._losses: list[torch.Tensor] = []
        self._seen = False
        #: Set on the device where a loss was not finite; ``None`` until a step needs it.
        self.flag: torch.Tensor | None = None

    def note(self, loss: torch.Tensor) -> None:
        self._losses.append(loss)

    def look(self, skipped: bool | None) -> None:
        """The step's losses, now that ``skipped`` is known on the host (``None``: only on
        the device)."""
        losses, self._losses = self._losses, []
        if not losses or skipped is False:
            return
        if skipped:
            self._seen = self._seen or not all(bool(torch.isfinite(x).all()) for x in losses)
            return
        if self.flag is None:
            self.flag = torch.zeros((), dtype=torch.bool, device=losses[0].device)
        for loss in losses:
            self.flag.logical_or_(torch.isfinite(loss.detach()).logical_not().any())

    def seen(self) -> bool:
        """Whether a loss was seen not finite on the host since the last call."""
        seen, self._seen = self._seen, False
        return seen


class Skips:
    """Which steps GradScaler skipped: how many, how many in a row, how many in the start-up
    (see the module's docstring for how a skip is known).

    :meth:`begin` is called as ``scaler.step`` starts (for each optimizer it steps),
    :meth:`decide` once ``scaler.update`` has run. With a guard or a watch each device-decided
    step's flag also goes into a ring of ``ring`` slots that the next check reads along with
    the scale. The start-up burst is counted as the search's replay counts it: skips from the
    first steps, each at most ``STARTUP_GAP`` steps after the one before.
    """

    def __init__(self, *, ring: int) -> None:
        self._ring = ring
        self._modes = Modes()
        # This step's optimizers and the post-hook count as it began; the scale before it
        # (a device copy, made on the first step that needs one).
        self._stepping: list[tuple[torch.optim.Optimizer, str]] = []
        self._taken_before, self._copied = 0, False
        self._before: torch.Tensor | None = None
        self._flags: torch.Tensor | None = None
        self._on_device: torch.Tensor | None = None  # the count of skips decided there
        self._pending: list[int] = []  # steps whose flags wait in the ring
        self._losses = BadLosses()  # with an in-run check: see note_loss
        #: Whether a loss :meth:`note_loss` saw since the previous read was not finite.
        self.bad_loss = False
        self.restore(0, steps=0)

    def restore(
        self, skipped: int, *, steps: int, streak: int = 0, startup: Sequence[Any] | None = None
    ) -> None:
        """Start from ``skipped`` skips after ``steps`` steps, ``streak`` of them in a row,
        and the start-up burst as ``startup`` (its skips, its last step, whether it is still
        open) left it (a checkpoint's counts)."""
        self._host, self.streak, self._pending = skipped, streak, []
        if startup is None:
            self.startup, self.startup_last, self._startup_open = 0, -1, steps == 0
        else:
            count, last, still = startup
            self.startup, self.startup_last, self._startup_open = int(count), int(last), bool(still)
        if self._on_device is not None:
            self._on_device.zero_()

    @property
    def startup_open(self) -> bool:
        """Whether the start-up burst may still grow (its next skip within ``STARTUP_GAP``)."""
        return self._startup_open

    @property
    def total(self) -> int:
        if self._on_device is None:
            return self._host
        return self._host + int(self._on_device.item())

    def on_device(self, device: torch.device) -> torch.Tensor:
        """:attr:`total` as a new 0-d int64 tensor on ``device``, read without a host sync:
        the skips decided on the device are added there."""
        if self._on_device is None:
            return torch.full((), self._host, dtype=torch.int64, device=device)
        return self._on_device + self._host

    def begin(self, scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
        """``scaler.step(optimizer)`` is about to run (once per optimizer it steps)."""
        if not self._stepping:
            self._taken_before, self._copied = self._modes.taken.count, False
        mode = self._modes.of(optimizer)
        self._stepping.append((optimizer, mode))
        scale = live_scale(scaler)  # on the device, no sync
        if mode != "host" and not self._copied and scale is not None:
            # step() leaves the scale alone; update() changes it in place
            if self._before is None:
                self._before = torch.empty_like(scale)
            self._before.copy_(scale)
            self._copied = True

    def decide(self, scaler: torch.amp.GradScaler, index: int) -> bool | DeviceStep:
        """``scaler.update()`` has run for step ``index``: count it; whether the optimizer
        stepped (a :class:`DeviceStep` where only the device knows)."""
        stepping, self._stepping = self._stepping, []
        if all(mode == "host" for _, mode in stepping):
            silent = self._modes.taken.count - self._taken_before < len(stepping)
            self._record(index, silent, on_host=True)
            self._losses.look(silent)
            return not silent
        scale, before = live_scale(scaler), self._before  # update() changed it
        if scale is None or before is None or not self._copied:  # no step began
            return True
        skipped = torch.lt(scale, before)
        if len(stepping) == 1 and stepping[0][1] == "verify":
            backed_off = bool(skipped)
            self._record(index, backed_off, on_host=True)
            silent = self._modes.taken.count == self._taken_before
            self._modes.verified(stepping[0][0], backed_off, silent)
            self._losses.look(backed_off)
            return not backed_off
        self._losses.look(None)
        if self._on_device is None:
            self._on_device = torch.zeros((), dtype=torch.int64, device=scale.device)
        self._on_device.add_(skipped)
        if self._ring:
            if self._flags is None:
                self._flags = torch.zeros(self._ring, dtype=torch.bool, device=scale.device)
            self._flags[index % self._ring].copy_(skipped)
            self._pending.append(index)
        return DeviceStep(skipped)

    def host(self, index: int, *, skipped: bool) -> None:
        """Step ``index`` decided on the host, by an engine that steps itself and says
        whether it skipped (DeepSpeed's)."""
        self._record(index, skipped, on_host=True)

    def note_loss(self, loss: torch.Tensor) -> None:
        """A loss about to be scaled, kept until its step is decided (:meth:`decide`): whether
        any since the last read was inf or NaN is read with the scale (``bad_loss``). A float16
        loss that is not finite is a forward that overflowed, which no loss scale fixes. Its
        step is always skipped, so only a skipped step's losses are looked at: on the host,
        where GradScaler decided it there (one read, on skipped steps only), else on the
        device (two small ops a loss, read with the scale)."""
        self._losses.note(loss)

    def read(self, scale: torch.Tensor) -> tuple[float, int]:
        """The scale and the count of skipped steps on the host, in one transfer with the
        flags the ring holds since the last read, which bring the streak and the start-up up
        to date, and whether a loss was not finite since the last read (``bad_loss``)."""
        seen = self.bad_loss = self._losses.seen()
        flag = self._losses.flag
        if self._on_device is None and flag is None:
            return float(scale), self._host
        parts = [scale.reshape(1).double()]
        if flag is not None:
            parts.append(flag.reshape(1).double())
        if self._on_device is not None:
            parts.append(self._on_device.reshape(1).double())
            if self._flags is not None:
                parts.append(self._flags.double())
        values = torch.cat(parts).tolist()
        if flag is not None:
            self.bad_loss = seen or bool(values.pop(1))
            flag.zero_()
        if self._on_device is None:
            return values[0], self._host
        for index in self._pending:
            self._record(index, bool(values[2 + index % self._ring]), on_host=False)
        self._pending = []
        return values[0], self._host + int(values[1])

    def _record(self, index: int, skipped: bool, *, on_host: bool) -> None:
        if not skipped:
            self.streak = 0
            # No later skip can be within STARTUP_GAP of the burst's last one any more.
            if self._startup_open and index - self.startup_last >= STARTUP_GAP:
                self._startup_open = False
            return
        self._host += on_host
        self.streak += 1
        if self._startup_open and index - self.startup_last <= STARTUP_GAP:
            self.startup, self.startup_last = self.startup + 1, index
        else:
            self._startup_open = False
