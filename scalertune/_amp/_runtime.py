"""AmpRuntime: the canonical AMP step, used by every trial and by the user's training code."""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from scalertune._amp._config import SCALER_KNOBS, AmpConfig, DeepSpeedFp16Config
from scalertune._amp._device import resolve_device
from scalertune._amp._engine import Engine, EngineSlot
from scalertune._amp._guard import Guard, check_guard
from scalertune._amp._islands import apply_islands
from scalertune._amp._scaler import DeviceStep, RuntimeScaler, Skips, scaler_class
from scalertune._amp._watch import AmpDriftWarning, Watch, caller_stacklevel
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

    def __init__(
        self,
        config: AmpConfig,
        *,
        device: str | torch.device | None = "auto",
        guard: Guard | None = None,
        watch: Watch | None = None,
    ) -> None:
        self.config = config
        self.guard = guard if config.uses_scaler else None
        self.watch = watch if config.uses_scaler else None
        self.device = resolve_device(device)
        # DeepSpeed's fp16 scaler is its engine's (bound with :meth:`bind`), not a GradScaler
        self._engine = EngineSlot(needed=isinstance(config, DeepSpeedFp16Config))
        self._forward = _Forward(config, self.device)
        #: The GradScaler (a :class:`~scalertune._amp._scaler.RuntimeScaler`: it reports each
        #: step to this runtime, whoever calls it; disabled for bfloat16 and float32).
        self.scaler: torch.amp.GradScaler = self._scaler(RuntimeScaler)
        self.steps = 0
        self._checks = _Checks(self.guard, self.watch) if self.guard or self.watch else None
        self._skips = Skips(ring=self._checks.every if self._checks else 0)
        self._stepped: bool | DeviceStep = True
        # `scale` before GradScaler's first backward, and without one: made once, not per step
        self._initial_scale = torch.full(
            (), config.init_scale if config.uses_scaler else 1.0, device=self.device
        )
        self._clip = _Clip(config.clip_norm) if config.clip_norm is not None else None
        # read on every step: a plain attribute
        self._uses_scaler = config.uses_scaler and not self._engine.needed
        #: Called after each :meth:`backward` and first in :meth:`step`, while the gradients
        #: are backward's own: the float32 reference's gradient trace reads them there
        #: (``_run._trace_collector``).
        self._after_backward: Callable[[], None] | None = None
        self._before_step: Callable[[], None] | None = None

    @classmethod
    def from_yaml(
        cls,
        path: str,
        *,
        device: str | torch.device | None = "auto",
        guard: bool = True,
        watch: bool = True,
        best_amp: bool = False,
    ) -> AmpRuntime:
        """Build the runtime from a YAML file that ``scalertune search`` wrote, with the
        guard it recommends (``guard=False`` for none) and a watch on the scaler it predicts
        (``watch=False`` for none; a file without a prediction has none). ``best_amp=True``
        loads the best AMP config that held (``evidence.best_amp``) instead of the answer:
        for a GPU, when the search ran where float32 is faster."""
        from scalertune._amp._schema import load_runtime

        return cls(**load_runtime(path, guard=guard, watch=watch, best_amp=best_amp), device=device)

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

        An FSDP1-wrapped ``model`` gets ``ShardedGradScaler`` (see
        :class:`~scalertune._amp._scaler.RuntimeScaler`), before the first step.
        """
        if self.steps == 0 and type(self.scaler) is not scaler_class(model):
            self.scaler = self._scaler(scaler_class(model))  # FSDP1: ShardedGradScaler
        return self._forward.prepare(model)

    def _scaler(self, kind: type[torch.amp.GradScaler]) -> torch.amp.GradScaler:
        config = self.config
        return kind(
            self.device.type,
            listener=self,  # type: ignore[call-arg]
            enabled=config.uses_scaler and not self._engine.needed,
            **{k: getattr(config, k) for k in SCALER_KNOBS},
        )

    def bind(self, engine: Engine) -> None:
        """Train through ``engine``, which scales, clips and steps itself (DeepSpeed's): from
        here :meth:`backward` and :meth:`step` are the engine's, and the runtime counts and
        checks the steps it decides (see :mod:`scalertune._amp._engine`). Binding the bound
        engine again changes nothing."""
        self._engine.bind(engine)

    @property
    def engine(self) -> Engine | None:
        """The engine bound with :meth:`bind`, if any."""
        return self._engine.engine

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backward through the scaled loss (plain backward when no scaler is active; the
        bound engine's backward); ``kwargs`` go to ``Tensor.backward`` (``retain_graph``)."""
        if self._engine.active:
            self._engine.backward(loss, gradients=self._after_backward is not None, **kwargs)
        else:
            self.scaler.scale(loss).backward(**kwargs)
        if self._after_backward is not None:
            self._after_backward()

    def step(self, optimizer: torch.optim.Optimizer) -> bool | DeviceStep:
        """Unscale, clip (if configured), step the optimizer unless skipped, update the scale;
        returns whether the optimizer really stepped.

        Call after :meth:`backward`. Gradients are clipped on their true (unscaled) values,
        over all parameters the optimizer holds. The result is False for a step GradScaler
        skipped (its gradients were inf/NaN): step an LR scheduler only when it is true, as
        Accelerate does, or the schedule runs ahead of the optimizer. For an optimizer that
        applies GradScaler's flag inside its own kernel (fused Adam, AdamW, SGD) only the
        device knows: the result is then a :class:`~scalertune._amp._scaler.DeviceStep`
        whose ``bool()`` reads it (one transfer, taken only if asked).
        """
        if self._before_step is not None:
            self._before_step()
        if self._engine.engine is not None:
            return self._engine_step(self._engine.engine)
        if self._clip is not None:
            self._clip(self.scaler, optimizer)
        if not self._uses_scaler:
            optimizer.step()
            self.steps += 1
            return True
        self.scaler.step(optimizer)
        self.scaler.update()
        return self._stepped

    def _engine_step(self, engine: Engine) -> bool:
        """The bound engine's step (its clipping, its optimizer, its scaler), counted."""
        stepped = self._stepped = engine.step()
        self._skips.host(self.steps, skipped=not stepped)
        self.steps += 1
        if self._checks is not None and self.steps % self._checks.every == 0:
            self._checks.run(self)
        return stepped

    @property
    def last_step(self) -> bool | DeviceStep:
        """Whether the optimizer really stepped on the last step GradScaler decided (what
        :meth:`step` returned; for a framework that calls the scaler itself, the same)."""
        return self._stepped

    def scaler_stepping(self, optimizer: torch.optim.Optimizer) -> None:
        """Called by :attr:`scaler` as ``scaler.step(optimizer)`` starts."""
        self._skips.begin(self.scaler, optimizer)

    def scaler_updated(self) -> None:
        """Called by :attr:`scaler` once ``scaler.update()`` has decided the step: count it,
        and run the guard and the watch when they are due."""
        self._stepped = self._skips.decide(self.scaler, self.steps)
        self.steps += 1
        if self._checks is not None and self.steps % self._checks.every == 0:
            self._checks.run(self)

    def train_step(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        batch: tuple[Any, Any],
    ) -> torch.Tensor:
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
        if self._engine.engine is not None:
            return torch.full((), self._engine.engine.scale(), device=self.device)
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
        return {
            "scaler": self._engine.state() if self._engine.active else self.scaler.state_dict(),
            "steps": self.steps,
            "skipped": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.load_scaler_state(state["scaler"])
        self.steps = int(state["steps"])
        self._skips.restore(int(state["skipped"]), steps=self.steps)

    def load_scaler_state(self, state: Mapping[str, Any]) -> None:
        """Start the scaler from ``state`` (a checkpoint's, or where the replay puts a
        config's scaler at a branch's first step): GradScaler's keys over its own, or the
        bound engine's (kept for the engine until it is bound)."""
        if self._engine.active:
            self._engine.load(state)
        else:
            self.scaler.load_state_dict({**self.scaler.state_dict(), **state})


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
            contextlib.nullcontext()
            if self._float32
            else torch.autocast(device.type, dtype=self._dtype)
        )

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self._float32:
            return contextlib.nullcontext()
        if self.islands and not self._prepared:
            raise UsageError(
                f"this config keeps {', '.join(self.islands)} in float32 "
                "(fp32_modules): call model = amp.prepare(model) once before "
                "training"
            )
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
            params = self._params[id(optimizer)] = [
                p for group in optimizer.param_groups for p in group["params"]
            ]
        torch.nn.utils.clip_grad_norm_(params, self.max_norm)


class _Checks:
    """The guard and the watch, every ``every`` steps (the guard's cadence when there is one):
    one host read of the scale, then the guard may raise and the watch may warn, once."""

    def __init__(self, guard: Guard | None, watch: Watch | None) -> None:
        self.guard, self.watch = guard, watch
        cadence = guard if guard is not None else watch
        if cadence is None:
            raise ValueError("checks need a guard or a watch")
        self.every = cadence.check_every
        self._warned = False

    def run(self, amp: AmpRuntime) -> None:
        skips = amp._skips  # noqa: SLF001 - the runtime's own bookkeeping
        scale, skipped = skips.read(amp.scale)
        if self.guard is not None:
            check_guard(
                self.guard,
                scale=scale,
                streak=skips.streak,
                step=amp.steps,
                islands=amp.config.fp32_modules,
            )
        if self.watch is None or self._warned:
            return
        found = self.watch.drift(
            amp.config,
            steps=amp.steps,
            skipped=skipped,
            startup=skips.startup,
            startup_last=skips.startup_last,
            scale=scale,
        )
        if found is not None:
            self._warned = True
            warnings.warn(AmpDriftWarning(found), stacklevel=caller_stacklevel())
