"""AmpRuntime: the canonical AMP step, used by every trial and by the user's training code."""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, Iterable

import torch

from scalertune._amp._config import AmpConfig
from scalertune._amp._device import resolve_device
from scalertune._amp._guard import Guard, check_guard
from scalertune._amp._islands import apply_islands
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

    The runtime never waits for the device: skipped steps are counted in a device tensor and
    only read when ``skipped_steps`` is asked for. The one host sync per step is
    GradScaler's own (it must know whether to call ``optimizer.step``).

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
                 guard: Guard | None = None) -> None:
        self.config = config
        self.guard = guard if config.uses_scaler else None
        self.device = resolve_device(device)
        self._dtype = getattr(torch, config.dtype)
        self.scaler = torch.amp.GradScaler(
            self.device.type,
            init_scale=config.init_scale,
            growth_factor=config.growth_factor,
            backoff_factor=config.backoff_factor,
            growth_interval=config.growth_interval,
            enabled=config.uses_scaler,
        )
        self.steps = 0
        self._skipped = torch.zeros((), dtype=torch.int64, device=self.device)
        self._streak = torch.zeros((), dtype=torch.int64, device=self.device)
        # What `scale` reads before GradScaler's first backward, and always without a scaler:
        # made once, so the per-step read allocates nothing.
        self._initial_scale = torch.full(
            (), config.init_scale if config.uses_scaler else 1.0, device=self.device)
        self._clip_params: dict[int, list[torch.nn.Parameter]] = {}
        self._prepared: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()

    @classmethod
    def from_yaml(cls, path: str, *, device: str | torch.device | None = "auto",
                  guard: bool = True) -> "AmpRuntime":
        """Build the runtime from a YAML file that ``scalertune search`` wrote, with the
        guard it recommends (``guard=False`` for none)."""
        from scalertune._amp._schema import load_config, load_guard

        return cls(load_config(path), device=device, guard=load_guard(path) if guard else None)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward context: autocast to the config's dtype (a no-op for float32).

        A config with float32 islands refuses to autocast before :meth:`prepare` has applied
        them to a model: without them the modules they name overflow float16 again.
        """
        if self.config.fp32_modules and not self._prepared and self.config.dtype != "float32":
            raise UsageError(
                f"this config keeps {', '.join(self.config.fp32_modules)} in float32 "
                "(fp32_modules): call model = amp.prepare(model) once before training")
        if self.config.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._dtype)

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Apply the config's float32 islands to ``model`` (in place; returns it).

        Each module that ``fp32_modules`` names or matches (glob patterns over
        ``model.named_modules()`` names) runs with autocast disabled and its floating inputs
        cast to float32, so activations beyond float16's 65504 stay finite there; its output
        stays float32, and the next module under autocast casts it back down.

        An island is a pair of forward hooks, not a replaced ``forward``: the module keeps its
        class, its parameters and its ``state_dict`` keys, and ``copy.deepcopy`` (EMA, SWA),
        ``pickle``/``torch.save(model)`` and ``torch.compile`` carry the island along with the
        module it belongs to. Calling it twice is harmless; a config without islands leaves
        the model untouched. A name or pattern that selects no module is a
        :class:`UsageError` that suggests the closest names.
        """
        if not self.config.fp32_modules or model in self._prepared:
            return model
        apply_islands(model, self.config.fp32_modules, self.device.type)
        self._prepared.add(model)
        return model

    def backward(self, loss: torch.Tensor) -> None:
        """Backward through the scaled loss (plain backward when no scaler is active)."""
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale, clip (if configured), step the optimizer unless skipped, update the scale.

        Call after :meth:`backward`. Gradients are clipped on their true (unscaled) values,
        over all parameters the optimizer holds.
        """
        if self.config.clip_norm is not None:
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(self._parameters_of(optimizer), self.config.clip_norm)
        if self.config.uses_scaler:
            before = self.scaler._scale.clone()  # noqa: SLF001 - read on device, no sync
            self.scaler.step(optimizer)
            self.scaler.update()
            # update() multiplies the scale by backoff_factor < 1 exactly when the step was
            # skipped, so a smaller scale afterwards *is* a skipped step.
            skipped = (self.scaler._scale < before).to(torch.int64)  # noqa: SLF001
            self._skipped += skipped
            if self.guard is not None:
                self._streak.add_(1).mul_(skipped)
        else:
            optimizer.step()
        self.steps += 1
        if self.guard is not None and self.steps % self.guard.check_every == 0:
            self._check_guard()

    def _check_guard(self) -> None:
        scale, streak = torch.stack((self.scaler._scale.reshape(()).double(),  # noqa: SLF001
                                     self._streak.double())).tolist()
        check_guard(self.guard, scale=scale, streak=int(streak), step=self.steps,
                    islands=self.config.fp32_modules)

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
        self.prepare(model)
        inputs, targets = batch
        optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss = loss_fn(model(inputs), targets)
        self.backward(loss)
        self.step(optimizer)
        return loss.detach()

    @property
    def scale(self) -> torch.Tensor:
        """The current loss scale as a device tensor (1.0 when no scaler is active); no sync."""
        if self.config.uses_scaler and self.scaler._scale is not None:  # noqa: SLF001
            return self.scaler._scale.reshape(())  # noqa: SLF001
        return self._initial_scale

    @property
    def skipped_steps(self) -> int:
        """Steps GradScaler skipped because gradients were inf/NaN (reads the device)."""
        return int(self._skipped.item())

    def state_dict(self) -> dict[str, Any]:
        """Scaler state and counters, for checkpoints."""
        return {"scaler": self.scaler.state_dict(), "steps": self.steps,
                "skipped": self.skipped_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.scaler.load_state_dict(state["scaler"])
        self.steps = int(state["steps"])
        self._skipped.fill_(int(state["skipped"]))

    def _parameters_of(self, optimizer: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
        params = self._clip_params.get(id(optimizer))
        if params is None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            self._clip_params[id(optimizer)] = params
        return params


