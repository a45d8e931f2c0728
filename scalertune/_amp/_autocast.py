"""The forward side of the AMP step: autocast to the config's dtype, the float32 islands that
must be on the model before it runs, the float32 passes of the in-run check; and the
unscale-then-clip of the step side."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from scalertune._amp import _float8
from scalertune._amp._check import RunCheck
from scalertune._amp._config import AmpConfig
from scalertune._amp._islands import apply_islands
from scalertune._amp._torch_private import check_release
from scalertune._errors import UsageError


class Forward:
    """Autocast to the config's dtype, with the config's float32 islands on every model
    :meth:`prepare` has seen; inside :meth:`float32` no autocast at all (the in-run check's
    float32 forward of the same step)."""

    def __init__(
        self,
        config: AmpConfig,
        device: torch.device,
        model_check: Callable[[torch.nn.Module], None] | None = None,
    ) -> None:
        check_release()  # once a process: a torch outside the releases checked is said
        self.device = device
        #: From a result file: called with the first model prepared, whether it is the one
        #: the file was searched on (``_fingerprint``), then dropped.
        self._model_check = model_check
        self._prepared: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._float32_now = False
        self.configure(config)

    def configure(self, config: AmpConfig) -> None:
        """Train under ``config`` from now on: its dtype (float8's recipe, or out of float8),
        and its islands on every model prepared so far (a model keeps the islands it has;
        they are only ever added)."""
        self._take(config)
        self.islands = config.fp32_modules
        for model in list(self._prepared):
            apply_islands(model, self.islands, self.device.type)
        #: The context :meth:`AmpRuntime.loss` enters on every step, made once: it is entered
        #: and left in turn, never nested, and making one costs more than entering it. Until a
        #: model is prepared, a config that needs :meth:`prepare` refuses to run instead.
        self.reused: contextlib.AbstractContextManager[Any] = (
            _Unprepared(self) if self._needs_prepare() else self._context()
        )

    def _take(self, config: AmpConfig) -> None:
        """``config``'s forward: its autocast dtype, and its float8 recipe's torchao config."""
        self.config = config
        self._dtype = getattr(torch, config.autocast_dtype)
        self._float32 = config.autocast_dtype == "float32"
        self._float8 = (
            _float8.linear_settings(config, device=self.device) if config.float8 else None
        )

    def _context(self) -> contextlib.AbstractContextManager[Any]:
        around: contextlib.AbstractContextManager[Any] = (
            contextlib.nullcontext()
            if self._float32
            else torch.autocast(self.device.type, dtype=self._dtype)
        )
        if self._float8 is not None:
            return _float8.Float8Context(self._float8, around)
        return around

    def _needs_prepare(self) -> bool:
        return bool(self.islands or self.config.float8) and not self._prepared

    def unprepared(self) -> UsageError:
        """The one line for a config whose model must be prepared first."""
        what = (
            "trains its Linear layers in float8"
            if self.config.float8
            else f"keeps {', '.join(self.islands)} in float32 (fp32_modules)"
        )
        return UsageError(
            f"this config {what}: call model = amp.prepare(model) once before training"
        )

    @property
    def models(self) -> list[torch.nn.Module]:
        """The models :meth:`prepare` has seen (and that are still alive)."""
        return list(self._prepared)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self._float32_now or self.config.dtype == "float32":
            return contextlib.nullcontext()
        if self._needs_prepare():
            raise self.unprepared()
        return self._context()

    @contextlib.contextmanager
    def trying(self, config: AmpConfig) -> Iterator[None]:
        """The forward of ``config`` inside (another float8 recipe, bfloat16), this one's
        again after: the in-run check's pass of a config it may move to. Its islands are not
        applied (they are hooks on the modules, only ever added)."""
        saved = self.config, self._dtype, self._float32, self._float8
        self._take(config)
        try:
            yield
        finally:  # the same objects back: the float8 layers keep the recipe they hold
            self.config, self._dtype, self._float32, self._float8 = saved

    @contextlib.contextmanager
    def float32(self) -> Iterator[None]:
        """No autocast inside, whoever asks for it (a framework's forward included)."""
        before, self._float32_now = self._float32_now, True
        try:
            with torch.autocast(self.device.type, enabled=False), _float8.high_precision():
                yield
        finally:
            self._float32_now = before

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        if self._model_check is not None:
            check, self._model_check = self._model_check, None
            check(model)
        if model not in self._prepared:
            if self.config.float8:
                _float8.convert(model, self.config, device=self.device)
            if self.islands:
                apply_islands(model, self.islands, self.device.type)
            self._prepared.add(model)
            self.reused = self._context()
        return model


class _Unprepared(contextlib.AbstractContextManager[Any]):
    """The step's context before :meth:`Forward.prepare` has run for a config that needs it
    (:meth:`Forward.prepare` replaces it): one line, not a run trained without its float8 or
    islands."""

    def __init__(self, forward: Forward) -> None:
        self.forward = forward

    def __enter__(self) -> Any:
        raise self.forward.unprepared()

    def __exit__(self, *exc: object) -> None:
        return None


class Clip:
    """Unscale, then clip the gradients of all the parameters an optimizer holds to
    ``max_norm``. The list is made once per optimizer and made again where the optimizer is
    another one (a new optimizer may take a freed one's ``id``) or its groups changed
    (``add_param_group``, a group's list grown): every parameter it steps is clipped."""

    def __init__(self, max_norm: float) -> None:
        self.max_norm = max_norm
        #: Per optimizer's ``id``: the optimizer itself (weakly), its groups' sizes when the
        #: list was made, and the list.
        self._params: dict[
            int, tuple[weakref.ref[torch.optim.Optimizer], tuple[int, ...], list[torch.Tensor]]
        ] = {}
        #: The total norm of the last step's unscaled gradients, before clipping (a tensor on
        #: the device: read it only when it is wanted, as nanoGPT prints it).
        self.last_norm: torch.Tensor | None = None

    def __call__(self, scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
        scaler.unscale_(optimizer)
        self.last_norm = torch.nn.utils.clip_grad_norm_(self._of(optimizer), self.max_norm)

    def _of(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        sizes = tuple(len(group["params"]) for group in optimizer.param_groups)
        kept = self._params.get(id(optimizer))
        if kept is not None and kept[0]() is optimizer and kept[1] == sizes:
            return kept[2]
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self._params[id(optimizer)] = (weakref.ref(optimizer), sizes, params)
        return params


class CheckTurns:
    """When a runtime hands its in-run check the step's loss
    (:meth:`~scalertune.AmpRuntime.loss`): once a step, when the check's policy says, while
    training (not evaluating) in a dtype below float32.

    Example:
        >>> class EveryStep:
        ...     def due(self, steps): return True
        >>> turns = CheckTurns()
        >>> turns.take(EveryStep(), 3, "float16"), turns.take(EveryStep(), 3, "float16")
        (True, False)
    """

    def __init__(self) -> None:
        self._step = -1  # the step the check last took

    def take(self, check: RunCheck, steps: int, dtype: str) -> bool:
        """Whether the loss of step ``steps``, trained in ``dtype``, is ``check``'s; taken if
        so."""
        if (
            check.due(steps)
            and self._step != steps
            and dtype != "float32"  # after a fall back: nothing to check against
            and torch.is_grad_enabled()
        ):
            self._step = steps
            return True
        return False
