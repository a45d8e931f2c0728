"""AmpRuntime: the canonical AMP step, used by every trial and by the user's training code."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from scalertune._amp._autocast import Clip, Forward
from scalertune._amp._check import RunCheck
from scalertune._amp._checkpointed import Checkpointed
from scalertune._amp._config import SCALER_KNOBS, AmpConfig
from scalertune._amp._decisions import ScalerDecisions
from scalertune._amp._device import resolve_device
from scalertune._amp._guard import Guard
from scalertune._amp._readback import Readback
from scalertune._amp._scaler import DeviceStep, RuntimeScaler, Skips, scaler_class, set_knobs
from scalertune._amp._watch import Watch


class AmpRuntime(ScalerDecisions, Checkpointed):
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
    ``guard`` and a ``watch`` read the device once every ``check_every`` steps. An in-run
    ``check`` (``scalertune.load`` and ``scalertune.attach`` build one from the result file)
    computes a step's loss again in float32 every ``check.policy.every`` steps, through
    :meth:`loss` (one more forward and one host read then), and acts when the precision fails
    (see :mod:`scalertune._amp._check`).

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
        check: RunCheck | None = None,
        model_check: Callable[[torch.nn.Module], None] | None = None,
    ) -> None:
        self.config = config
        self.guard = guard if config.uses_scaler else None
        self.watch = watch if config.uses_scaler else None
        #: The in-run check (``None``: the run does not check itself); float32 has nothing
        #: to check against.
        self.check = check if config.dtype != "float32" else None
        self.device = resolve_device(device)
        self._forward = Forward(config, self.device, model_check)
        #: The GradScaler (a :class:`~scalertune._amp._scaler.RuntimeScaler`: it reports each
        #: step to this runtime, whoever calls it; disabled for bfloat16 and float32).
        self.scaler: torch.amp.GradScaler = self._scaler(RuntimeScaler)
        self.steps = 0
        reads = config.uses_scaler and (self.guard or self.watch or self.check)
        self._checks = Readback(self.guard, self.watch, self.check) if reads else None
        self._skips = Skips(ring=self._checks.every if self._checks else 0)
        self._stepped: bool | DeviceStep = True
        # `scale` before GradScaler's first backward, and without one: made once, not per step
        self._initial_scale = torch.full(
            (), config.init_scale if config.uses_scaler else 1.0, device=self.device
        )
        self._clip = Clip(config.clip_norm) if config.clip_norm is not None else None
        self._uses_scaler = config.uses_scaler  # read on every step: a plain attribute
        self._checked_step = -1  # the step the in-run check last ran at (once per step)
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
            enabled=config.uses_scaler,
            **{k: getattr(config, k) for k in SCALER_KNOBS},
        )

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backward through the scaled loss (plain backward when no scaler is active);
        ``kwargs`` go to ``Tensor.backward`` (``retain_graph``)."""
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
        if self._clip is not None:
            self._clip(self.scaler, optimizer)
        if not self._uses_scaler:
            optimizer.step()
            self.steps += 1
            return True
        self.scaler.step(optimizer)
        self.scaler.update()
        return self._stepped

    def loss(
        self,
        closure: Callable[[], Any],
        *,
        autocast: bool = True,
        recompute: Callable[[], Any] | None = None,
    ) -> Any:
        """Run ``closure`` (the forward and the loss, no backward) under :meth:`autocast`
        and return what it returns: the way a loop hands the runtime its loss, so that the
        run can check itself.

        Every ``check.policy.every`` steps (and sooner after a streak of skipped steps) the
        in-run check runs ``closure`` once more, in float32, without gradients, at the same
        weights, on the same batch and with the same random numbers (dropout), and compares
        the two losses; when the precision fails it acts by the result file's policy (see
        :mod:`scalertune._amp._check`). ``closure`` may return the loss, or a tuple or mapping
        holding it first or under ``"loss"`` (``(loss, logits)``, a model's output); it is
        called once per micro-batch, as the loss is.

        ``autocast=False`` is for a framework whose model's forward runs under
        :meth:`autocast` itself (the trainers :func:`scalertune.attach` drives);
        ``recompute`` is what the check's extra passes call instead of ``closure`` (a
        LightningModule's ``training_step`` with its logging held back).

        Example:
            >>> import torch, scalertune
            >>> model = torch.nn.Linear(4, 1)
            >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(dtype="bfloat16"), device="cpu")
            >>> model = amp.prepare(model)
            >>> x, y = torch.randn(8, 4), torch.randn(8, 1)
            >>> loss = amp.loss(lambda: torch.nn.functional.mse_loss(model(x), y))
            >>> amp.backward(loss)
            >>> amp.step(optimizer)
            True
        """
        if self.check is not None and self._check_due():
            self._checked_step = self.steps
            assert self.check is not None
            return self.check.run(self, closure, recompute or closure, autocast)
        if not autocast:
            return closure()
        with self._forward.reused:
            return closure()

    def _check_due(self) -> bool:
        """Whether this step's loss is the in-run check's: once a step, when its policy says,
        while training (not evaluating) in a dtype below float32."""
        check = self.check
        return (
            check is not None
            and check.due(self.steps)
            and self._checked_step != self.steps
            and self.config.dtype != "float32"  # after a fall back: nothing to check against
            and torch.is_grad_enabled()
        )

    def train_step(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        batch: tuple[Any, Any],
    ) -> torch.Tensor:
        """The whole canonical step on one ``(inputs, targets)`` batch; returns the loss.

        Applies the float32 islands (:meth:`prepare`) to ``model`` on first use; the loss
        goes through :meth:`loss`, so the run checks itself.
        """
        self._forward.prepare(model)
        inputs, targets = batch
        optimizer.zero_grad(set_to_none=True)
        loss: torch.Tensor = self.loss(lambda: loss_fn(model(inputs), targets))
        self.backward(loss)
        self.step(optimizer)
        return loss.detach()

    @property
    def models(self) -> list[torch.nn.Module]:
        """The models :meth:`prepare` has seen (the in-run check's islands go on them)."""
        return self._forward.models

    def float32(self) -> contextlib.AbstractContextManager[None]:
        """A context with no autocast at all, whoever asks for one inside it (the in-run
        check's float32 forward)."""
        return self._forward.float32()

    def reconfigure(self, config: AmpConfig, *, scale: float | None = None) -> None:
        """Train under ``config`` from the next step on (the in-run check's action): its
        float32 islands added to the prepared models, its scaler knobs set in place (and the
        scale set to ``scale``, where given), or float32: the scaler disabled, every later
        step taken. Only the islands, the dtype (to float32) and the knobs may change."""
        if config.uses_scaler and self._uses_scaler:
            set_knobs(self.scaler, config, scale=scale)
        elif self._uses_scaler:
            set_knobs(self.scaler, None)  # float32 from now on: no scaler
            self._uses_scaler, self._stepped = False, True
        self.config = config
        self._forward.configure(config)

    def report(self) -> None:
        """Print what the in-run check saw and did: its checks, its actions (each with its
        step and evidence) and the scaler's story beside the search's prediction."""
        print(self.check.report(self) if self.check is not None else "no in-run check")
