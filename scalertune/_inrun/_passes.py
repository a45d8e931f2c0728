"""The extra forward passes of an in-run check, on the step's own batch at the step's weights.

The training step's forward ran under autocast; a check runs the same loss again, forward
only and without gradients, so that nothing of the training changes:

- with the random numbers the step's forward drew (a dropout mask is the same mask), the
  random state put back afterwards;
- with the model's buffers put back afterwards (a BatchNorm in training mode updates its
  running statistics on every forward);
- in float32 (no autocast anywhere inside, a framework's own forward included), or under
  the run's autocast with some modules kept in float32 for the pass (islands on trial), or
  with hooks on every module that see which one turned finite inputs into non-finite outputs
  (a forward overflow), or how large each module's outputs are (the island candidates).

On N ranks every rank runs every pass (the model's forward may hold collectives), and the
figures that decide are averaged over the ranks (:func:`over_ranks`), so that every rank
takes the same decision at the same step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from scalertune._amp import _float8
from scalertune._amp._config import AmpConfig
from scalertune._amp._islands import make_island, unwrapped
from scalertune._amp._modules import kept_in_float32
from scalertune._amp._runtime import AmpRuntime
from scalertune._errors import UsageError
from scalertune._inrun._float8_layers import LayerCast, layer_casts, record_inputs


def loss_value(output: Any) -> torch.Tensor:
    """The loss in what a loss function, a step or a ``training_step`` returns: a scalar
    tensor, the first item of a tuple or list, or a mapping's (or a model output's)
    ``"loss"``; a one-line :class:`UsageError` for anything else."""
    found = output
    if isinstance(found, Mapping) or hasattr(found, "keys"):
        found = found.get("loss") if hasattr(found, "get") else None
    elif isinstance(found, (tuple, list)) and found:
        found = found[0]
    if isinstance(found, torch.Tensor) and found.numel() == 1:
        return found.reshape(())
    what = type(output).__name__
    shape = f" of shape {tuple(output.shape)}" if isinstance(output, torch.Tensor) else ""
    raise UsageError(
        f"the loss closure returned a {what}{shape}: return the scalar loss tensor (or a tuple "
        "with it first, or a mapping with it under 'loss')"
    )


def over_ranks(
    values: Sequence[float] | torch.Tensor, device: torch.device, *, largest: bool = False
) -> list[float]:
    """``values`` averaged over the ranks of the process group (with ``largest``, the largest
    of the ranks'; as they are without one): one host read."""
    tensor = torch.as_tensor(values, dtype=torch.float64, device=device).reshape(-1).clone()
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        # gloo and NCCL both take float64; a non-finite value stays non-finite in the mean
        if largest:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        else:
            dist.all_reduce(tensor)
            tensor /= dist.get_world_size()
    return [float(v) for v in tensor.tolist()]


class Passes:
    """The extra passes of one check: made before the step's own forward, so that it holds
    the random state that forward starts from."""

    def __init__(self, amp: AmpRuntime, recompute: Callable[[], Any], *, autocast: bool) -> None:
        self.amp, self.recompute, self.autocast = amp, recompute, autocast
        self._inputs: dict[str, tuple[torch.nn.Linear, torch.Tensor]] | None = None
        self._devices = [amp.device] if amp.device.type == "cuda" else []
        self._cpu = torch.get_rng_state()
        self._device = torch.cuda.get_rng_state(amp.device) if self._devices else None

    def float32(self) -> torch.Tensor:
        """The loss in float32 at the step's weights (under float8, the Linear layers' inputs
        recorded on the way, for :meth:`float8_casts`: no forward of their own)."""
        models = self.amp.models if self.amp.config.float8 else []
        recording: contextlib.AbstractContextManager[dict[str, Any]] = (
            record_inputs(models[0]) if models else contextlib.nullcontext({})
        )
        with self._quiet(), recording as inputs, self.amp.float32():
            loss = loss_value(self.recompute()).detach().float()
        self._inputs = inputs if models else None
        return loss

    def islanded(self, modules: Sequence[str]) -> torch.Tensor:
        """The loss under the run's autocast with ``modules`` kept in float32 for this pass."""
        with self._quiet(), self._islands(modules), self._autocast():
            return loss_value(self.recompute()).detach().float()

    def under(self, config: AmpConfig) -> torch.Tensor:
        """The loss with the forward of ``config`` (another float8 recipe, bfloat16).

        Its forward is entered here whoever runs the step: a trainer's step (Lightning's,
        a Hugging Face Trainer's) runs inside the run's own forward already, whose float8
        recipe would otherwise hold for the pass; the innermost float8 setting holds."""
        settings = (
            _float8.linear_settings(config, device=self.amp.device) if config.float8 else None
        )
        with (
            self._quiet(),
            self.amp.trying(config),
            self.amp.autocast(),
            _float8.Float8Context(settings, contextlib.nullcontext()),
        ):
            return loss_value(self.recompute()).detach().float()

    def float8_errors(self) -> dict[str, float]:
        """Layer name -> how far its float8 output under the run's recipe is from its
        float32 output, on the step's batch at the step's weights (``_float8_layers``)."""
        (casts,) = self.float8_casts([self.amp.config])
        return {c.name: c.error for c in casts}

    def float8_casts(self, configs: Sequence[AmpConfig]) -> list[list[LayerCast]]:
        """What float8 under each of ``configs``' recipes costs each Linear layer, on the
        step's batch at the step's weights: one float32 pass records the layers' inputs."""
        inputs = self._inputs
        if inputs is None:  # no float32 pass of float8 yet (the run left float8 before it)
            models = self.amp.models
            if not models:
                return [[] for _ in configs]
            with self._quiet(), record_inputs(models[0]) as inputs, self.amp.float32():
                self.recompute()
        return [layer_casts(inputs, config, device=self.amp.device) for config in configs]

    def outputs(self) -> dict[str, float]:
        """Module name -> the largest magnitude of its floating outputs in float32, in the
        order the modules ran (the model itself left out)."""
        peaks: dict[str, float] = {}

        def seen(name: str, output: Any) -> None:
            peak = max((float(t.detach().abs().amax()) for t in _floats(output)), default=0.0)
            peaks[name] = max(peaks.get(name, 0.0), peak)

        with self._quiet(), _hooked(self.amp.models, seen), self.amp.float32():
            self.recompute()
        return peaks

    def overflowing(self, islands: Sequence[str] = ()) -> list[str]:
        """The modules whose own computation, under the run's autocast (``islands`` kept in
        float32 for the pass), turned finite inputs into non-finite outputs (each module's
        inputs and outputs looked at as it runs)."""
        culprits: list[str] = []

        def seen(name: str, output: Any, inputs: Any = ()) -> None:
            inner = any(c.startswith(name + ".") for c in culprits)  # its submodule did it
            fresh = name not in culprits and not inner
            if fresh and _all_finite(inputs) and not _all_finite(output):
                culprits.append(name)

        with (
            self._quiet(),
            self._islands(islands),
            _hooked(self.amp.models, seen, inputs=True),
            self._autocast(),
        ):
            self.recompute()
        return culprits

    def module_names(self) -> list[str]:
        """The names of the models' modules (the models themselves left out), as the
        passes name them."""
        return [n for m in self.amp.models for n, _ in unwrapped(m).named_modules() if n]

    def in_float32(self) -> set[str]:
        """The modules the run keeps in float32 already: those its islands name or match
        (a parent's name, a glob) and every module inside one, which no float8 or autocast
        reaches: none is a culprit, and none a new island."""
        entries = self.amp.config.fp32_modules
        return {n for n in self.module_names() if kept_in_float32(n, entries)}

    def whole(self, name: str) -> bool:
        """Whether module ``name`` holds every parameter of its model: an island of it is the
        whole model in float32, not an island."""
        for model in self.amp.models:
            modules = dict(unwrapped(model).named_modules())
            if name in modules:
                total = sum(1 for _ in modules[""].parameters())
                return total > 0 and sum(1 for _ in modules[name].parameters()) == total
        return False

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """No gradients, the step's random numbers, and copies of the buffers: the pass
        leaves no trace on the training. The buffers are swapped for copies, not saved and
        written back: the step's own backward may hold them (BatchNorm's running statistics)
        and refuses a buffer changed in place since its forward."""
        held = []
        for model in self.amp.models:
            for module in model.modules():
                for name, buffer in list(module.named_buffers(recurse=False)):
                    held.append((module, name, buffer))
                    setattr(module, name, buffer.detach().clone())
        with torch.no_grad(), _float8.extra_pass(), torch.random.fork_rng(devices=self._devices):
            torch.set_rng_state(self._cpu)
            if self._device is not None:
                torch.cuda.set_rng_state(self._device, self.amp.device)
            try:
                yield
            finally:
                for module, name, buffer in held:
                    setattr(module, name, buffer)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        return self.amp.autocast() if self.autocast else contextlib.nullcontext()

    @contextlib.contextmanager
    def _islands(self, names: Sequence[str]) -> Iterator[None]:
        handles = []
        for model in self.amp.models:
            modules = dict(unwrapped(model).named_modules())
            for name in names:
                if name in modules:
                    handles += make_island(modules[name], self.amp.device.type)
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


@contextlib.contextmanager
def _hooked(
    models: Sequence[torch.nn.Module], seen: Callable[..., None], *, inputs: bool = False
) -> Iterator[None]:
    """Forward hooks on every module of ``models`` but the models themselves, calling
    ``seen(name, output)`` (and the inputs, with ``inputs``) as each module returns."""
    handles = []
    for model in models:
        for name, module in unwrapped(model).named_modules():
            if not name:
                continue
            if inputs:
                hook = _hook_with_inputs(name, seen)
                handles.append(module.register_forward_hook(hook, with_kwargs=True))
            else:
                handles.append(module.register_forward_hook(_hook(name, seen)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _hook(name: str, seen: Callable[..., None]) -> Callable[..., None]:
    def hook(_module: torch.nn.Module, _args: Any, output: Any) -> None:
        seen(name, output)

    return hook


def _hook_with_inputs(name: str, seen: Callable[..., None]) -> Callable[..., None]:
    def hook(_module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        seen(name, output, (args, kwargs))

    return hook


def _floats(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() and obj.numel():
            yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _floats(value)
    elif isinstance(obj, (tuple, list)):
        for value in obj:
            yield from _floats(value)


def _all_finite(obj: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in _floats(obj))
