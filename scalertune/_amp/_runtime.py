"""AmpRuntime: the canonical AMP step, used by every trial and by the user's training code."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any, Callable

import torch

from scalertune._amp._config import SCALER_KNOBS, AmpConfig
from scalertune._amp._device import resolve_device
from scalertune._amp._guard import Guard, check_guard
from scalertune._amp._islands import apply_islands
from scalertune._amp._watch import STARTUP_GAP, AmpDriftWarning, Watch, caller_stacklevel
from scalertune._errors import UsageError


class AmpRuntime:
    """Owns the autocast context, the GradScaler and the unscale-then-clip step.

    One object per training run. The canonical AMP step it implements is::

        with amp.autocast():                 # forward + loss in the low-precision dtype
            loss = loss_fn(model(x), y)
        amp.backward(loss)                   # scaler.scale(loss).backward()
        amp.step(optimizer)                  # unscale_, clip_grad_norm_, scaler.step, update

    Why this order: backward runs on ``loss * scale`` so that small float16 gradients do not
    flush to zero. ``unscale_`` divides the gradients by the scale in place and records
    whether any is inf/NaN; clipping has to come after it, or ``max_norm`` would be compared
    with gradients that are still ``scale`` times too large. ``scaler.step`` skips the
    optimizer step when non-finite gradients were found (a *skipped step*), and
    ``scaler.update`` then multiplies the scale by ``backoff_factor``; after
    ``growth_interval`` finite steps in a row it multiplies it by ``growth_factor``.

    For bfloat16 and float32 the scaler is disabled: ``backward`` is a plain backward and
    ``step`` clips (if asked) and steps.

    The runtime adds no host sync to GradScaler's one per step (it must know whether to call
    ``optimizer.step``), and counts skipped steps from that decision (:class:`_Skips`). A
    ``guard`` and a ``watch`` read the device once every ``check_every`` steps.

    Example:
        >>> import torch, scalertune
        >>> model = torch.nn.Linear(4, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=4096.0), device="cpu")
        >>> x, y = torch.randn(8, 4), torch.randn(8, 1)
        >>> loss = amp.train_step(model, optimizer, torch.nn.functional.mse_loss, (x, y))
        >>> amp.steps, amp.skipped_steps
        (1, 0)
    """

    def __init__(self, config: AmpConfig, *, device: str | torch.device | None = "auto",
                 guard: Guard | None = None, watch: Watch | None = None) -> None:
        self.config = config
        self.guard = guard if config.uses_scaler else None
        self.watch = watch if config.uses_scaler else None
        self.device = resolve_device(device)
        self._forward = _Forward(config, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.uses_scaler,
                                           **{k: getattr(config, k) for k in SCALER_KNOBS})
        self.steps = 0
        self._checks = _Checks(self.guard, self.watch) if self.guard or self.watch else None
        self._skips = _Skips(ring=self._checks.every if self._checks else 0)
        # `scale` before GradScaler's first backward, and without one: made once, not per step
        self._initial_scale = torch.full(
            (), config.init_scale if config.uses_scaler else 1.0, device=self.device)
        self._clip = _Clip(config.clip_norm) if config.clip_norm is not None else None
        self._uses_scaler = config.uses_scaler  # read on every step: a plain attribute
        #: Called after each :meth:`backward` and first in :meth:`step`, while the gradients
        #: are backward's own: the float32 reference's gradient trace reads them there
        #: (``_run._trace``).
        self._after_backward: Callable[[], None] | None = None
        self._before_step: Callable[[], None] | None = None

    @classmethod
    def from_yaml(cls, path: str, *, device: str | torch.device | None = "auto",
                  guard: bool = True, watch: bool = True,
                  best_amp: bool = False) -> "AmpRuntime":
        """Build the runtime from a YAML file that ``scalertune search`` wrote, with the
        guard it recommends (``guard=False`` for none) and a watch on the scaler it predicts
        (``watch=False`` for none; a file without a prediction has none). ``best_amp=True``
        loads the best AMP config that held (``evidence.best_amp``) instead of the answer:
        for a GPU, when the search ran where float32 is faster."""
        from scalertune._amp._schema import load_runtime

        return cls(**load_runtime(path, guard=guard, watch=watch, best_amp=best_amp),
                   device=device)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward context: autocast to the config's dtype (a no-op for float32).

        A config with float32 islands refuses to autocast before :meth:`prepare` has applied
        them to a model: without them the modules they name overflow float16 again.
        """
        return self._forward.autocast()

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Apply the config's float32 islands to ``model`` (in place; returns it).

        Each module that ``fp32_modules`` names or matches (glob patterns over
        ``model.named_modules()`` names) runs with autocast disabled and its floating inputs
        cast to float32, so activations beyond float16's 65504 stay finite there; its output
        stays float32, and the next module under autocast casts it back down. An island is a
        pair of forward hooks (see :mod:`._islands`), so deepcopy (EMA, SWA), pickling and
        ``torch.compile`` carry it with its module. Calling it twice is harmless; a name or
        pattern that selects no module is a :class:`UsageError` naming the closest names.
        """
        return self._forward.prepare(model)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward through the scaled loss (plain backward when no scaler is active)."""
        self.scaler.scale(loss).backward()
        if self._after_backward is not None:
            self._after_backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale, clip (if configured), step the optimizer unless skipped, update the scale.

        Call after :meth:`backward`. Gradients are clipped on their true (unscaled) values,
        over all parameters the optimizer holds.
        """
        if self._before_step is not None:
            self._before_step()
        if self._clip is not None:
            self._clip(self.scaler, optimizer)
        if self._uses_scaler:
            self._skips.step(self.scaler, optimizer, self.steps)
        else:
            optimizer.step()
        self.steps += 1
        if self._checks is not None and self.steps % self._checks.every == 0:
            self._checks.run(self)

    def train_step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   loss_fn: Callable[[Any, Any], torch.Tensor],
                   batch: tuple[Any, Any]) -> torch.Tensor:
        """The whole canonical step on one ``(inputs, targets)`` batch; returns the loss.

        Applies the float32 islands (:meth:`prepare`) to ``model`` on first use.
        """
        self._forward.prepare(model)
        inputs, targets = batch
        optimizer.zero_grad(set_to_none=True)
        with self._forward.reused:
            loss = loss_fn(model(inputs), targets)
        self.backward(loss)
        self.step(optimizer)
        return loss.detach()

    @property
    def scale(self) -> torch.Tensor:
        """The current loss scale as a device tensor (1.0 when no scaler is active); no sync."""
        if not self._uses_scaler:  # a disabled GradScaler has no _scale at all
            return self._initial_scale
        scale = self.scaler._scale  # noqa: SLF001 - GradScaler's live scale, read in place
        if scale is None:
            return self._initial_scale
        # GradScaler keeps a 0-d tensor; reshaping one anyway is a device op on every step.
        return scale if scale.dim() == 0 else scale.reshape(())

    @property
    def skipped_steps(self) -> int:
        """Steps GradScaler skipped because gradients were inf/NaN (no device read, except
        for an optimizer that skips inside its own kernel: see :class:`_Skips`)."""
        return self._skips.total

    @property
    def _skipped(self) -> torch.Tensor:
        """``skipped_steps`` as a device tensor, for ``_run._timing``'s window arithmetic."""
        return torch.full((), self._skips.total, dtype=torch.int64, device=self.device)

    def state_dict(self) -> dict[str, Any]:
        """Scaler state and counters, for checkpoints."""
        return {"scaler": self.scaler.state_dict(), "steps": self.steps,
                "skipped": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.scaler.load_state_dict(state["scaler"])
        self.steps = int(state["steps"])
        self._skips.restore(int(state["skipped"]), steps=self.steps)


class _Forward:
    """The forward side of the step: autocast to the config's dtype, and the float32 islands
    that must be on the model before it may run."""

    def __init__(self, config: AmpConfig, device: torch.device) -> None:
        self.config, self.device = config, device
        self.islands = config.fp32_modules
        self._dtype = getattr(torch, config.dtype)
        self._float32 = config.dtype == "float32"
        self._prepared: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        #: The context :meth:`AmpRuntime.train_step` enters on every step, made once: it is
        #: entered and left in turn, never nested, and making one costs more than entering it.
        self.reused: contextlib.AbstractContextManager[Any] = (
            contextlib.nullcontext() if self._float32
            else torch.autocast(device.type, dtype=self._dtype))

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self._float32:
            return contextlib.nullcontext()
        if self.islands and not self._prepared:
            raise UsageError(f"this config keeps {', '.join(self.islands)} in float32 "
                             "(fp32_modules): call model = amp.prepare(model) once before "
                             "training")
        return torch.autocast(self.device.type, dtype=self._dtype)

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.islands and model not in self._prepared:
            apply_islands(model, self.islands, self.device.type)
            self._prepared.add(model)
        return model


class _Clip:
    """Unscale, then clip the gradients of all the parameters an optimizer holds to
    ``max_norm`` (the list made once per optimizer, not on every step)."""

    def __init__(self, max_norm: float) -> None:
        self.max_norm = max_norm
        self._params: dict[int, list[torch.Tensor]] = {}

    def __call__(self, scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
        scaler.unscale_(optimizer)
        params = self._params.get(id(optimizer))
        if params is None:
            params = self._params[id(optimizer)] = [p for group in optimizer.param_groups
                                                    for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, self.max_norm)


class _Taken:
    """An optimizer step post-hook: counts the optimizer steps that really ran."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, *_: Any) -> None:
        self.count += 1


class _Skips:
    """Which steps GradScaler skipped: how many, how many in a row, how many in the start-up.

    For an ordinary optimizer GradScaler decides on the host: ``scaler.step`` reads the
    inf/NaN flag (its one sync per step) and calls ``optimizer.step()`` only when the
    gradients are finite. A post-hook on the optimizer that did not fire during
    ``scaler.step`` *is* a skipped step, known on the host with no device work at all. Until
    one step has been seen to run, the hook is checked against the scale (below, one read per
    step of the start-up), so an optimizer whose hooks never fire cannot pass for one that
    skips every step.

    An optimizer that applies the flag itself (``_step_supports_amp_scaling``: fused Adam,
    AdamW, SGD) is always called and skips inside its kernel, so the host never learns. There
    the scale tells: ``update()`` multiplies it by ``backoff_factor < 1`` exactly when the
    step was skipped, so a smaller scale afterwards is a skipped step. That comparison stays
    on the device, summed into a device count; with a guard or a watch each step's flag also
    goes into a ring of ``ring`` slots that the next check reads along with the scale.

    The start-up burst is counted as the search's replay counts it: skips from the first
    steps, each at most ``STARTUP_GAP`` steps after the one before.
    """

    def __init__(self, *, ring: int) -> None:
        self._ring = ring
        self._taken = _Taken()
        self._modes: dict[int, tuple[torch.optim.Optimizer, str]] = {}
        self._optimizer: torch.optim.Optimizer | None = None
        self._mode = "device"
        # Made on the first step that needs them: the scale before the step, each step's
        # flag (one slot, or the ring), and the count of skips decided on the device.
        self._before = self._flags = self._on_device = None
        self._pending: list[int] = []  # steps whose flags wait in the ring
        self.restore(0, steps=0)

    def restore(self, skipped: int, *, steps: int) -> None:
        """Start from ``skipped`` skips after ``steps`` steps (a checkpoint's counts)."""
        self._host, self.streak, self._pending = skipped, 0, []
        self.startup, self.startup_last, self._startup_open = 0, -1, steps == 0
        if self._on_device is not None:
            self._on_device.zero_()

    @property
    def total(self) -> int:
        if self._on_device is None:
            return self._host
        return self._host + int(self._on_device.item())

    def step(self, scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer,
             index: int) -> None:
        """``scaler.step(optimizer)`` and ``scaler.update()`` for step ``index``, counted."""
        if optimizer is not self._optimizer:
            self._select(optimizer)
        taken = self._taken.count
        if self._mode == "host":
            scaler.step(optimizer)
            scaler.update()
            self._record(index, self._taken.count == taken, on_host=True)
            return
        scale = scaler._scale  # noqa: SLF001 - read on the device, no sync
        if self._before is None:
            self._before = torch.empty_like(scale)
            self._flags = torch.zeros(max(self._ring, 1), dtype=torch.bool, device=scale.device)
        self._before.copy_(scale)
        scaler.step(optimizer)
        scaler.update()
        slot = self._flags[index % len(self._flags)]
        torch.lt(scale, self._before, out=slot)  # update() changed `scale` in place
        if self._mode == "verify":
            self._verify(optimizer, index, bool(slot), self._taken.count == taken)
            return
        if self._on_device is None:
            self._on_device = torch.zeros((), dtype=torch.int64, device=scale.device)
        self._on_device.add_(slot)
        if self._ring:
            self._pending.append(index)

    def read(self, scale: torch.Tensor) -> tuple[float, int]:
        """The scale and the count of skipped steps on the host, in one transfer with the
        flags the ring holds since the last read, which bring the streak and the start-up up
        to date."""
        if self._on_device is None:
            return float(scale), self._host
        values = torch.cat((scale.reshape(1).double(), self._on_device.reshape(1).double(),
                            self._flags.double())).tolist()
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

    def _select(self, optimizer: torch.optim.Optimizer) -> None:
        known = self._modes.get(id(optimizer))
        if known is None or known[0] is not optimizer:
            fused = getattr(optimizer, "_step_supports_amp_scaling", False)
            hooks = hasattr(optimizer, "register_step_post_hook")
            mode = "verify" if hooks and not fused else "device"
            if mode == "verify":
                weakref.finalize(self, optimizer.register_step_post_hook(self._taken).remove)
            known = self._modes[id(optimizer)] = (optimizer, mode)
        self._optimizer, self._mode = known

    def _verify(self, optimizer: torch.optim.Optimizer, index: int, backed_off: bool,
                hook_silent: bool) -> None:
        """Count the step by the scale; trust the hook from the first step it ran and the hook
        heard it, and never if the two disagree."""
        self._record(index, backed_off, on_host=True)
        if backed_off != hook_silent:
            self._mode = "device"
        elif not backed_off:
            self._mode = "host"
        self._modes[id(optimizer)] = (optimizer, self._mode)


class _Checks:
    """The guard and the watch, every ``every`` steps (the guard's cadence when there is one):
    one host read of the scale, then the guard may raise and the watch may warn, once."""

    def __init__(self, guard: Guard | None, watch: Watch | None) -> None:
        self.guard, self.watch = guard, watch
        self.every = guard.check_every if guard is not None else watch.check_every
        self._warned = False

    def run(self, amp: AmpRuntime) -> None:
        skips = amp._skips  # noqa: SLF001 - the runtime's own bookkeeping
        scale, skipped = skips.read(amp.scale)
        if self.guard is not None:
            check_guard(self.guard, scale=scale, streak=skips.streak, step=amp.steps,
                        islands=amp.config.fp32_modules)
        if self.watch is None or self._warned:
            return
        found = self.watch.drift(amp.config, steps=amp.steps, skipped=skipped,
                                 startup=skips.startup, startup_last=skips.startup_last,
                                 scale=scale)
        if found is not None:
            self._warned = True
            warnings.warn(AmpDriftWarning(found), stacklevel=caller_stacklevel())
