"""float8 training of a model's Linear layers, through torchao, with a way back out.

float8's e4m3 keeps 3 significant bits and a range of about 448 down to ``2**-9``, so every
matmul input is scaled first, from its own largest magnitude (*amax*): ``x * 448 / amax``
fills the range. The recipe decides over what the amax is taken: the whole tensor
(``tensorwise``, torchao's default and the fastest), each row (``rowwise``), or each row with
the weight gradient computed in high precision (``rowwise_with_gw_hp``). One massive value in
a tensor (an attention-sink token, an outlier channel grown late in training) sets a
tensorwise scale so small that every ordinary value of the tensor falls below ``2**-9`` and
flushes to zero: the layer then sees almost nothing of its input. Per row, only that row
suffers. Gradients go to e5m2 (2 bits, a wider range), scaled the same way.

A converted layer is torchao's ``Float8Linear`` (its class here is a subclass of it, made
when float8 is first used), with the same parameters, so the optimizer built on the model
still holds them. It computes in float8 only inside a float8 runtime's forward
(:class:`Float8Context`, which carries the recipe), and otherwise as a plain Linear layer:

- in the in-run check's float32 forward (:func:`high_precision`);
- in a float32 island (the island's own hooks: an island is out of float8 too);
- once the runtime left float8 (the in-run check moved the run to bfloat16 or float32), and
  under another runtime on the same model (the step timing interleaves dtypes on one model).

Layers whose sizes are not multiples of 16 are left out (float8 matmul kernels need them),
and said once; so are matmul layers of another class than ``torch.nn.Linear`` (transformers'
``Conv1D`` in GPT-2), which torchao does not convert.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from scalertune._amp import _torchao_private as torchao
from scalertune._amp._islands import in_island, unwrapped
from scalertune._amp._modules import kept_in_float32
from scalertune._amp._torch_private import in_backward
from scalertune._amp._watch import caller_stacklevel
from scalertune._text import plural

#: float8 matmuls (``torch._scaled_mm``) need both sizes of a weight to be multiples of this.
FLOAT8_MULTIPLE = 16

#: CUDA devices from this compute capability have float8 tensor cores (Ada, Hopper, Blackwell).
FLOAT8_CAPABILITY = (8, 9)


_STATE = threading.local()


def native(device: torch.device) -> bool:
    """Whether ``device`` runs float8 matmuls natively; elsewhere torchao emulates them (the
    numerics are float8's, the speed is not)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= FLOAT8_CAPABILITY


@contextlib.contextmanager
def high_precision() -> Iterator[None]:
    """No float8 inside: every converted layer runs a plain ``F.linear`` (the in-run check's
    float32 forward)."""
    before = getattr(_STATE, "depth", 0)
    _STATE.depth = before + 1
    try:
        yield
    finally:
        _STATE.depth = before


@contextlib.contextmanager
def extra_pass() -> Iterator[None]:
    """A forward that is no training step's (the in-run check's passes, between a step's
    forward and its backward): a checkpoint's recompute of the step does not take its
    recipe."""
    before = getattr(_STATE, "extra", False)
    _STATE.extra = True
    try:
        yield
    finally:
        _STATE.extra = before


def _plain_here() -> bool:
    """Whether a layer must compute without float8 here, whatever recipe is on: inside
    :func:`high_precision` or a float32 island."""
    return getattr(_STATE, "depth", 0) > 0 or in_island()


def _active() -> Any:
    """The torchao config of the float8 forward running now in this thread; ``None`` when
    the layers must compute without float8."""
    if _plain_here():
        return None
    return getattr(_STATE, "active", None)


class Float8Context(contextlib.AbstractContextManager[None]):
    """A float8 runtime's forward: the float8 layers compute in float8 with ``settings`` (a
    recipe's torchao config; ``None``: no float8) inside, within ``around`` (bfloat16
    autocast, or none). A runtime makes one and enters it on every step; the innermost one
    entered holds (the in-run check's pass of another recipe, inside a trainer's step)."""

    def __init__(self, settings: Any, around: contextlib.AbstractContextManager[Any]) -> None:
        self.settings = settings
        self.around = around
        self._before: list[Any] = []

    def __enter__(self) -> None:
        self._before.append(getattr(_STATE, "active", None))
        _STATE.active = self.settings
        self.around.__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            self.around.__exit__(*exc)
        finally:
            _STATE.active = self._before.pop()


def convert(model: torch.nn.Module, config: Any, *, device: torch.device) -> list[str]:
    """Make every Linear layer of ``model`` whose sizes float8 takes a float8 layer of
    ``config`` (an :class:`~scalertune.AmpConfig` with ``dtype="float8"``), in place.

    Returns:
        The names of the Linear layers left out for their sizes (said once, in one line).
    """
    cls = float8_class()
    settings = linear_settings(config, device=device)
    inner = unwrapped(model)
    out = left_out(inner)
    others = not_linear(inner)
    converted = []
    for name, module in list(inner.named_modules()):
        if type(module) is torch.nn.Linear and name not in out:
            _replace(inner, name, cls.from_float(module, config=settings))
            converted.append(name)
    if out:
        _say_once(left_out_line(out))
    if others:
        _say_once(not_linear_line(others))
    if not converted:  # a float8 config that trains nothing in float8: not to be missed
        _say_once(
            "float8: no layer of this model takes float8, so it trains in "
            f"{config.float8_around} throughout, as a {config.float8_around} config would: "
            "float8 needs torch.nn.Linear layers whose sizes are multiples of "
            f"{FLOAT8_MULTIPLE}"
        )
    elif (held := islands_hold_all(config, converted)) is not None:
        _say_once(f"float8: the {held}")
    return out


def islands_hold_all(config: Any, layers: list[str]) -> str | None:
    """Where ``config``'s float32 islands hold every one of ``layers`` (those float8 takes),
    so that it trains no layer in float8, the words that say so (``None``: some layer
    trains in float8)."""
    if not layers or not all(kept_in_float32(name, config.fp32_modules) for name in layers):
        return None
    return (
        f"float32 islands ({', '.join(config.fp32_modules)}) hold every layer float8 takes "
        f"({_shown(layers)}), so it trains no layer in float8, as a {config.float8_around} "
        "config would"
    )


def _shown(names: list[str]) -> str:
    """The first three names, and how many more."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def left_out(model: torch.nn.Module) -> list[str]:
    """The Linear layers of ``model`` whose sizes float8 matmuls cannot take."""
    return [
        name
        for name, module in unwrapped(model).named_modules()
        if type(module) is torch.nn.Linear
        and (module.in_features % FLOAT8_MULTIPLE or module.out_features % FLOAT8_MULTIPLE)
    ]


def left_out_line(names: list[str] | tuple[str, ...]) -> str:
    """The one line that says which Linear layers stay out of float8, and why."""
    named = _shown([repr(n) for n in names])
    return (
        f"float8: {'layers' if len(names) > 1 else 'layer'} {named} left out of float8 "
        "(sizes not multiples of "
        f"{FLOAT8_MULTIPLE}, which float8 matmuls need); "
        f"{'they run' if len(names) > 1 else 'it runs'} in the precision around float8"
    )


def not_linear(model: torch.nn.Module) -> list[tuple[str, str]]:
    """The matmul layers of ``model`` that float8 does not convert, each with its class: a
    weight of two dimensions in a class other than ``torch.nn.Linear`` (transformers'
    ``Conv1D``, GPT-2's projections; a subclass of Linear), where torchao converts
    ``torch.nn.Linear`` alone."""
    made = _CLASSES.get("_Float8")
    found = []
    for name, module in unwrapped(model).named_modules():
        weight = getattr(module, "weight", None)
        if type(module) is torch.nn.Linear or not isinstance(weight, torch.Tensor):
            continue
        if weight.dim() != 2:  # a convolution's, an embedding's is a lookup
            continue
        if made is not None and isinstance(module, made):
            continue
        if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D":
            found.append((name, type(module).__name__))
    return found


def not_linear_line(layers: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> str:
    """The one line that says which matmul layers float8 does not convert for their class."""
    names = [name for name, _ in layers]
    classes = ", ".join(sorted({cls for _, cls in layers}))
    return (
        f"float8: {plural(len(names), 'matmul layer')} of class {classes} ({_shown(names)}) "
        "left out of float8: torchao converts torch.nn.Linear alone; "
        f"{'they run' if len(names) > 1 else 'it runs'} in the precision around float8"
    )


def linear_settings(config: Any, *, device: torch.device) -> Any:
    """torchao's ``Float8LinearConfig`` for ``config``'s recipe and scale rounding, emulated
    where ``device`` has no float8 matmuls."""
    return torchao.linear_config(
        config.float8_recipe, round_scales=config.float8_round_scales, emulate=not native(device)
    )


def float8_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The float8 layers of ``model`` that :func:`convert` made."""
    if "_Float8" not in _CLASSES:
        return []
    cls = _CLASSES["_Float8"]
    return [m for m in unwrapped(model).modules() if isinstance(m, cls)]


def _replace(root: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, module)


class Float8LeftOut(UserWarning):
    """The Linear layers float8 leaves out for their sizes, and the matmul layers it leaves
    out for their class (said once per process; a search says it itself, before its runs)."""


_SAID: set[str] = set()


def _say_once(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        warnings.warn(line, Float8LeftOut, stacklevel=caller_stacklevel())


_CLASSES: dict[str, type[Any]] = {}


def float8_class() -> type[Any]:
    """The float8 layer class (torchao's ``Float8Linear`` with a way out), made once: torchao
    is imported only when float8 is used."""
    if "_Float8" not in _CLASSES:
        base = torchao.float8_linear_class()

        class _Float8(base):  # type: ignore[misc, valid-type]
            """torchao's ``Float8Linear`` inside a :class:`Float8Context`, a plain Linear
            layer elsewhere."""

            def forward(self, input: torch.Tensor) -> torch.Tensor:
                settings = None  # the check's float32 pass and islands run plain
                if not _plain_here():  # (what _active() reads, with its test made once)
                    settings = getattr(_STATE, "active", None)
                    if in_backward():
                        # activation checkpointing recomputes this forward in the backward,
                        # after the runtime's forward ended: as it ran, or the gradients differ
                        settings = getattr(self, "_ran_with", None)
                    elif not getattr(_STATE, "extra", False):  # (not the check's passes)
                        # what a recompute of this forward runs with (a reentrant
                        # checkpoint's forward runs without grad)
                        self._ran_with = settings
                if settings is None:
                    return torch.nn.functional.linear(input, self.weight, self.bias)
                if self.config is not settings:  # another recipe from this step on
                    torchao.set_module_config(self, settings)
                return super().forward(input)  # type: ignore[no-any-return]

        # printed as what it is (``print(model)`` shows Float8Linear, as under torchao)
        _Float8.__module__ = __name__
        _Float8.__qualname__ = _Float8.__name__ = "Float8Linear"
        _CLASSES["_Float8"] = _Float8
    return _CLASSES["_Float8"]


def __getattr__(name: str) -> Any:
    """The float8 layer class by name, so that a pickled or deep-copied float8 model finds
    it (``_Float8``: its name in models pickled by scalertune 0.5)."""
    if name in ("Float8Linear", "_Float8"):
        return float8_class()
    raise AttributeError(name)
