"""A Lightning ``Trainer`` under a runtime's config: its precision plugin, made from the runtime.

Lightning keeps everything mixed precision does in the strategy's precision plugin:
``MixedPrecision`` autocasts the forward (``forward_context``), scales the loss
(``pre_backward``), unscales before clipping, and calls ``scaler.step`` and ``scaler.update``
in ``optimizer_step``. :func:`route_lightning` puts a subclass of it on the Trainer's strategy
whose autocast is the runtime's (so its float32 islands hold) and whose scaler is the
runtime's GradScaler: Lightning's own loop, hooks and clipping (``gradient_clip_val``, set to
the config's) run unchanged. A float32 config gets Lightning's plain ``Precision``, and so
does float8 in float32 (with the runtime's forward: the Linear layers compute in float8 there),
so that the Trainer's ``precision`` says "32-true" and not an autocast that does not run.

Made with ``precision="16-mixed"`` on a CPU, a Trainer warns and trains ``bf16-mixed``
instead; the plugin set here is Lightning's own class with a device of "cpu", which trains in
float16 there. The plugin's methods overridden here, and what is set on the Trainer, are
listed in ``_lightning_private``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from scalertune._amp._runtime import AmpRuntime
from scalertune._amp._watch import caller_stacklevel
from scalertune._errors import UsageError
from scalertune._frameworks import _lightning_private
from scalertune._frameworks._deepspeed import refuse_deepspeed
from scalertune._text import cut

#: Lightning's precision flags a Trainer may have been given that mean autocast (or none):
#: the runtime's plugin replaces them. Any other ("16-true", "bf16-true", "64-true",
#: "transformer-engine", a DeepSpeed or FSDP plugin) changes the model itself.
_REPLACEABLE = ("32-true", "32", "16-mixed", "bf16-mixed")


def check_lightning(trainer: Any) -> None:
    """Refuse, in one line, a Trainer whose precision the runtime cannot take over."""
    strategy = trainer.strategy
    kind = type(strategy).__name__
    if kind == "DeepSpeedStrategy":
        refuse_deepspeed("this Trainer", "trainer")
    if kind not in ("SingleDeviceStrategy", "DDPStrategy"):
        raise UsageError(
            f"this Trainer runs {kind}: scalertune drives single-device and DDP Trainers only"
        )
    plugin = strategy.precision_plugin
    if type(plugin).__name__ not in (
        "Precision",
        "MixedPrecision",
        "_RuntimePrecision",
        "_Float32",
    ) or (str(plugin.precision) not in _REPLACEABLE):
        raise UsageError(
            f"this Trainer's precision is {plugin.precision!r} "
            f"({type(plugin).__name__}), which casts the model itself: make it "
            "with precision='32-true' (or 16-mixed, bf16-mixed) for scalertune to "
            "set mixed precision"
        )
    if getattr(trainer, "state", None) is not None and trainer.state.fn is not None:
        raise UsageError("this Trainer has run fit() already: attach before trainer.fit(...)")
    if type(plugin).__name__ in ("_RuntimePrecision", "_Float32"):
        raise UsageError(
            "this Trainer is attached to a runtime already: make a new one to attach another config"
        )


def route_lightning(trainer: Any, amp: AmpRuntime) -> None:
    """Set the runtime's precision plugin on ``trainer``'s strategy, and its clipping; a
    mixed precision the Trainer was given is said to be replaced, in one line (Lightning's
    own line about it, "Using bfloat16 Automatic Mixed Precision", no longer holds)."""
    package = _lightning_private.package(trainer, "Trainer")
    plugins = importlib.import_module(f"{package}.plugins.precision")
    given = str(trainer.strategy.precision_plugin.precision)
    if given in ("16-mixed", "bf16-mixed"):
        warnings.warn(
            f"scalertune: this Trainer's precision {given!r} is replaced by the config's: "
            f"{amp.config.describe()}",
            UserWarning,
            stacklevel=caller_stacklevel(),
        )
    trainer.strategy.precision_plugin = _plugin(plugins, amp)
    trainer.gradient_clip_val = amp.config.clip_norm
    trainer.gradient_clip_algorithm = "norm"


def _plugin(plugins: Any, amp: AmpRuntime) -> Any:
    config = amp.config

    class _KeepsRuntime(plugins.Precision):
        """Lightning keeps the precision plugin's state in every checkpoint and restores it
        in ``fit(ckpt_path=...)``: the runtime's, so that a resumed run keeps what the check
        did (under the plugin class's own name, as before)."""

        def state_dict(self) -> dict[str, Any]:
            return amp.state_dict()

        def load_state_dict(self, state: dict[str, Any]) -> None:
            _load(self, amp, state)

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            super().on_load_checkpoint(checkpoint)
            _say_if_stateless(self, checkpoint)

    class _Float32(_KeepsRuntime):
        """Lightning's plain precision, its optimizer steps counted by the runtime."""

        def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
            result = super().optimizer_step(*args, **kwargs)
            amp.steps += 1
            return result

    if config.dtype == "float32":
        return _Float32()
    # float8 in float32 has no autocast for Lightning to name: its plain precision ("32-true"),
    # with the runtime's forward (float8 inside) all the same
    mixed = config.autocast_dtype != "float32"
    base: Any = plugins.MixedPrecision if mixed else plugins.Precision

    class _RuntimePrecision(_KeepsRuntime, base):
        """Lightning's MixedPrecision (or plain Precision, for float8 in float32) with the
        runtime's autocast, float8, islands and scaler (which counts its steps; without one,
        as for bfloat16 and float8, they are counted here)."""

        def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
            result = super().optimizer_step(*args, **kwargs)
            if getattr(self, "scaler", None) is None:
                amp.steps += 1
            return result

        def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
            module = amp.prepare(super().convert_module(module))
            if amp.check is not None:
                _check_training_step(module, amp)
            return module

        @contextlib.contextmanager
        def forward_context(self) -> Iterator[None]:
            with amp.autocast():
                yield

    if not mixed:
        return _RuntimePrecision()
    precision = "16-mixed" if config.dtype == "float16" else "bf16-mixed"
    return _RuntimePrecision(
        precision, amp.device.type, scaler=amp.scaler if config.uses_scaler else None
    )


def _say_if_stateless(plugin: Any, checkpoint: dict[str, Any]) -> None:
    """One line where ``fit(ckpt_path=...)`` resumes from a checkpoint that holds no state of
    the runtime (Lightning keeps a precision plugin's under its class's qualified name)."""
    if type(plugin).__qualname__ not in checkpoint:
        warnings.warn(
            "scalertune: this Lightning checkpoint holds no runtime state (saved without "
            "scalertune attached, or by an earlier release): the run resumes with the config "
            "it was attached with, and the in-run check starts its record again",
            UserWarning,
            stacklevel=2,
        )


def _load(plugin: Any, amp: AmpRuntime, state: dict[str, Any]) -> None:
    """Restore the runtime from a checkpoint's precision state: its own, or, from a
    checkpoint an earlier release saved, the GradScaler's alone (Lightning's own); a state
    that is neither is refused in one line."""
    try:
        if "scaler" in state:
            amp.load_state_dict(state)
        elif state and amp.scaler.is_enabled():
            amp.scaler.load_state_dict(state)
    except Exception as exc:
        said = (str(exc).strip().splitlines() or [""])[0]
        raise UsageError(
            "cannot restore the runtime's state from this Lightning checkpoint "
            f"({type(exc).__name__}: {cut(said, 200)}): it is not what scalertune saved; "
            f"drop the checkpoint's {type(plugin).__qualname__!r} entry to resume with the "
            "config the run was attached with"
        ) from None


def _check_training_step(module: Any, amp: AmpRuntime) -> None:
    """The LightningModule's ``training_step`` through the runtime's
    :meth:`~scalertune.AmpRuntime.loss`, so that the run checks itself: Lightning runs it
    under the plugin's autocast already; the check's extra passes run it again with
    ``self.log`` and ``self.log_dict`` held back, so nothing is logged twice. A module that
    optimizes manually (``automatic_optimization = False``) steps inside ``training_step``,
    which cannot run twice: it is left unchecked."""
    if getattr(module, _CHECKED, False) or not getattr(module, "automatic_optimization", True):
        return  # manual optimization steps inside training_step: it cannot run twice
    original = module.training_step

    def quiet(*args: Any, **kwargs: Any) -> Any:
        held = {name: module.__dict__.get(name) for name in ("log", "log_dict")}
        module.log = module.log_dict = _no_log
        try:
            return original(*args, **kwargs)
        finally:
            for name, value in held.items():
                if value is None:
                    del module.__dict__[name]
                else:
                    module.__dict__[name] = value

    @functools.wraps(original)
    def training_step(*args: Any, **kwargs: Any) -> Any:
        return amp.loss(
            lambda: original(*args, **kwargs),
            autocast=False,
            recompute=lambda: quiet(*args, **kwargs),
        )

    module.training_step = training_step
    setattr(module, _CHECKED, True)


#: Marks a LightningModule whose ``training_step`` goes through the in-run check.
_CHECKED = "_scalertune_checked"


def _no_log(*_args: Any, **_kwargs: Any) -> None:
    """``self.log`` during the in-run check's extra passes: nothing."""


def lightning_device(trainer: Any) -> torch.device:
    """The device a (single-device or DDP) Lightning Trainer trains on."""
    return torch.device(trainer.strategy.root_device)
