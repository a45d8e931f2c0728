"""What float8 costs each Linear layer, at the same weights and on the same inputs: the
evidence an island (a layer kept out of float8) is chosen from, and the per-layer lines.

A float32 forward records every Linear layer's input (hooks, no gradients). Then, for each
layer alone, its input and weight are cast to e4m3 with the recipe's scales (one per tensor,
or one per row) and its output is computed again through torchao (the run's own numerics):

- **flushed**: the share of the input's nonzero values that the cast turns into zero. e4m3's
  smallest subnormal is ``2**-9``; the scale ``448 / amax`` puts the largest magnitude at 448,
  so a value more than ``448 * 2**10`` times smaller than the amax is gone. One massive value
  in a tensor (a row in 16 at 1e6) flushes every ordinary value of the tensor under a
  per-tensor scale; per row, only its own row's.
- **non-finite**: an input holding inf or NaN has no scale: the whole tensor is lost.
- **error**: how far the layer's float8 output is from its float32 output (relative, row by
  row, averaged). 3 significant bits cost a few percent by themselves; far more is a layer
  float8 spoils.

(Saturation cannot happen under torchao's dynamic scales: each amax is the tensor's own, so
no value exceeds 448; TransformerEngine's delayed scaling, whose amax comes from earlier
steps, is where it does.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from scalertune._amp import _float8
from scalertune._amp._config import AmpConfig
from scalertune._amp._islands import unwrapped
from scalertune._amp._modules import kept_in_float32

#: e4m3's largest finite value: a dynamic scale maps the amax there.
E4M3_MAX = 448.0

#: A layer whose float8 output is further than this from its float32 output (relative) is
#: spoiled by float8: 3 significant bits alone cost 2-4% on an ordinary layer (measured on
#: the MLPs of tests/float8_workloads.py: 2.5-3.7% per layer), so 10% is several times that.
LAYER_ERROR = 0.10

#: A layer that flushes more than this share of its nonzero inputs to zero is named.
FLUSHED = 0.01


@dataclasses.dataclass(frozen=True)
class LayerCast:
    """What float8 under one recipe costs one Linear layer, on one batch."""

    name: str
    recipe: str
    amax: float
    flushed: float
    error: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.amax)

    @property
    def spoiled(self) -> bool:
        """Whether float8 loses this layer: its input is not finite, or its output is far off
        float32's (a flush in the massive row itself, which stays close, is not named)."""
        return not self.finite or self.error > LAYER_ERROR

    def line(self) -> str:
        """The one line naming what float8 does to this layer."""
        where = f"float8 {self.recipe}, layer {self.name!r}"
        if not self.finite:
            return (
                f"{where}: its input holds inf/NaN, so its scale is not finite and the whole "
                "tensor is lost"
            )
        per = "tensor" if self.recipe == "tensorwise" else "row"
        if self.flushed > FLUSHED:
            return (
                f"{where}: input amax {self.amax:.3g} sets one scale per {per}: "
                f"{self.flushed:.1%} of its nonzero inputs flush to zero, and its output is "
                f"{self.error:.0%} off float32's"
            )
        return (
            f"{where}: its output is {self.error:.0%} off float32's with nothing flushed: "
            "float8's 3 significant bits are a precision floor here"
        )


def layer_casts(
    inputs: Mapping[str, tuple[torch.nn.Linear, torch.Tensor]],
    config: AmpConfig,
    *,
    device: torch.device,
) -> list[LayerCast]:
    """Each Linear layer float8 takes, under ``config``'s recipe, on the inputs
    :func:`record_inputs` recorded, in the order the layers ran."""
    settings = _float8.linear_settings(config, device=device)
    cls = _float8.float8_class()
    found = []
    for name, (module, x) in inputs.items():
        amax = float(x.abs().amax())
        if not math.isfinite(amax):
            found.append(LayerCast(name, config.float8_recipe, amax, 1.0, math.inf))
            continue
        with torch.no_grad():
            exact = torch.nn.functional.linear(x, module.weight, module.bias)
            layer = cls.from_float(_plain(module), config=settings)
            with _float8.Float8Context(settings, contextlib.nullcontext()):
                cast = layer(x)
        found.append(
            LayerCast(
                name=name,
                recipe=config.float8_recipe,
                amax=amax,
                flushed=_flushed(x, config.float8_recipe),
                error=_error(cast, exact),
            )
        )
    return found


def spoiling(casts: Sequence[LayerCast], config: AmpConfig) -> LayerCast | None:
    """The first layer of ``casts`` that float8 under ``config``'s recipe spoils
    (:attr:`LayerCast.spoiled`) outside ``config``'s islands; ``None`` where none is (or
    ``config`` is no float8 config)."""
    if not config.float8:
        return None
    return next(
        (
            c
            for c in casts
            if c.recipe == config.float8_recipe
            and c.spoiled
            and not kept_in_float32(c.name, config.fp32_modules)
        ),
        None,
    )


@contextlib.contextmanager
def record_inputs(
    model: torch.nn.Module, *, enabled: bool = True
) -> Iterator[dict[str, tuple[torch.nn.Linear, torch.Tensor]]]:
    """Inside, the first input of each Linear layer float8 takes (name -> the layer and its
    input in float32, detached) is recorded; every layer runs without float8."""
    inputs: dict[str, tuple[torch.nn.Linear, torch.Tensor]] = {}
    if not enabled:
        yield inputs
        return
    taken = set(_float8.left_out(model))
    handles = []
    for name, module in unwrapped(model).named_modules():
        if isinstance(module, torch.nn.Linear) and name not in taken:

            def seen(mod: torch.nn.Linear, args: tuple[Any, ...], name: str = name) -> None:
                if name not in inputs and args and isinstance(args[0], torch.Tensor):
                    inputs[name] = (mod, args[0].detach().float())

            handles.append(module.register_forward_pre_hook(seen))
    try:
        with _float8.high_precision():
            yield inputs
    finally:
        for handle in handles:
            handle.remove()


def _error(cast: torch.Tensor, exact: torch.Tensor) -> float:
    """How far ``cast`` is from ``exact``: the relative distance of each row, averaged over
    the rows (over the whole tensor, one massive row would hide every ordinary row's)."""
    rows, exact_rows = cast.reshape(-1, cast.shape[-1]), exact.reshape(-1, exact.shape[-1])
    distance = (rows - exact_rows).norm(dim=-1) / exact_rows.norm(dim=-1).clamp_min(1e-30)
    return float(distance.mean())


def _flushed(x: torch.Tensor, recipe: str) -> float:
    """The share of ``x``'s nonzero values that e4m3 under the recipe's input scale turns into
    zero (per tensor, or per row for the rowwise recipes)."""
    flat = x.reshape(-1, x.shape[-1])
    amax = flat.abs().amax() if recipe == "tensorwise" else flat.abs().amax(dim=-1, keepdim=True)
    scale = E4M3_MAX / amax.clamp_min(1e-12)
    nonzero = flat != 0
    cast = (flat * scale).to(torch.float8_e4m3fn).float()
    lost = nonzero & (cast == 0)
    return float(lost.sum()) / max(1, int(nonzero.sum()))


def _plain(module: torch.nn.Linear) -> torch.nn.Linear:
    """A plain Linear layer over ``module``'s own parameters (a float8 layer's too)."""
    with torch.device("meta"):
        plain = torch.nn.Linear(module.in_features, module.out_features, bias=False)
    plain.weight, plain.bias = module.weight, module.bias
    return plain


def island_candidates(casts: list[LayerCast], *, at_most: int) -> list[str]:
    """The layers float8 spoils most, worst first (``at_most`` of them; a layer spoiled under
    more than one recipe, once)."""
    names: list[str] = []
    for cast in sorted((c for c in casts if c.spoiled), key=lambda c: -c.error):
        if cast.name not in names:
            names.append(cast.name)
    return names[:at_most]


def iter_lines(casts: list[LayerCast]) -> Iterator[str]:
    for cast in casts:
        if cast.spoiled:
            yield cast.line()
