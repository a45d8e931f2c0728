"""A float8 config as torchao's own objects: ``Float8LinearConfig``, the filter of the layers it
converts, and ``convert_to_float8_training``; and as Accelerate's float8 (``AORecipeKwargs``).

torchao trains a Linear layer in float8 by scaling each matmul input from its own largest
magnitude, so a float8 run has no loss scaler: around the float8 matmuls it runs in float32, or
under bfloat16 autocast. The filter keeps two kinds of Linear layers out of float8, as the
search trained them: those inside a float32 island (``fp32_modules``, names or glob patterns),
and those whose sizes are not multiples of 16 (float8 matmuls need them).

Example:
    >>> import scalertune
    >>> config = scalertune.AmpConfig(dtype="float8", float8_recipe="rowwise")
    >>> print(scalertune.export(config, "torchao", device="cuda").code)  # doctest: +ELLIPSIS
    # scalertune export for torchao: float8 rowwise in float32, no clip
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    <BLANKLINE>
    config = Float8LinearConfig.from_recipe_name('rowwise')
    <BLANKLINE>
    <BLANKLINE>
    def module_filter_fn(mod, fqn):
    ...
    convert_to_float8_training(model, config=config, module_filter_fn=module_filter_fn)
    ...
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any

from scalertune._amp._config import AmpConfig
from scalertune._export._code import MODEL, Call, Device, Expr, Name, Named, Parts, Source

#: float8 matmuls (``torch._scaled_mm``) need both sizes of a weight to be multiples of this
#: (the runtime's ``FLOAT8_MULTIPLE``; a test holds the two equal).
FLOAT8_MULTIPLE = 16


@dataclasses.dataclass(frozen=True)
class Float8Filter:
    """torchao's ``module_filter_fn``: whether a Linear layer trains in float8.

    Not when the layer or a module around it is a float32 island (``islands``: names from
    ``model.named_modules()`` or glob patterns, as ``fp32_modules`` holds them), nor when a
    size of its weight is not a multiple of 16. The code of an export writes the same rule
    out as a function (:func:`filter_source`).

    Example:
        >>> import torch
        >>> keep = Float8Filter(("blocks.*.out",))
        >>> keep(torch.nn.Linear(32, 64), "blocks.0.up"), keep(torch.nn.Linear(32, 3), "head")
        (True, False)
        >>> keep(torch.nn.Linear(32, 64), "blocks.0.out.proj")
        False
    """

    islands: tuple[str, ...] = ()

    def __call__(self, mod: Any, fqn: str) -> bool:
        names = fqn.split(".")
        inside = [".".join(names[: i + 1]) for i in range(len(names))]
        if any(fnmatch.fnmatchcase(n, island) for n in inside for island in self.islands):
            return False
        return bool(
            mod.in_features % FLOAT8_MULTIPLE == 0 and mod.out_features % FLOAT8_MULTIPLE == 0
        )


def filter_source(islands: tuple[str, ...]) -> tuple[str, ...]:
    """:class:`Float8Filter` of ``islands`` as the code of a function ``module_filter_fn``."""
    sizes = (
        f"    return mod.in_features % {FLOAT8_MULTIPLE} == 0 and "
        f"mod.out_features % {FLOAT8_MULTIPLE} == 0"
    )
    if not islands:
        return (
            "def module_filter_fn(mod, fqn):",
            f'    """Whether torchao trains this Linear layer in float8: both its sizes '
            f'multiples of {FLOAT8_MULTIPLE}."""',
            sizes,
        )
    return (
        f"FLOAT32_ISLANDS = {list(islands)!r}  # fp32_modules: names or glob patterns",
        "",
        "",
        "def module_filter_fn(mod, fqn):",
        '    """Whether torchao trains this Linear layer in float8: not inside a float32 island,',
        f'    both its sizes multiples of {FLOAT8_MULTIPLE}."""',
        '    names = fqn.split(".")',
        '    inside = [".".join(names[: i + 1]) for i in range(len(names))]',
        "    if any(fnmatch.fnmatchcase(n, i) for n in inside for i in FLOAT32_ISLANDS):",
        "        return False",
        sizes,
    )


def float8_filter(c: AmpConfig) -> Named:
    """The filter, named ``module_filter_fn`` in the code."""
    imports = ("import fnmatch",) if c.fp32_modules else ()
    source = Source(filter_source(c.fp32_modules), imports, Float8Filter(c.fp32_modules))
    return Named("module_filter_fn", source)


def float8_config(c: AmpConfig, where: Device, name: str = "float8_config") -> Named:
    """torchao's ``Float8LinearConfig`` of ``c``: the recipe's own, with the scale rounding
    where ``c`` sets it, and ``emulate`` on a CPU (float8's numerics without float8 matmuls,
    as the search's runtime trains there)."""
    base = Call("torchao.float8:Float8LinearConfig.from_recipe_name", (c.float8_recipe,))
    changes: dict[str, Any] = {}
    if c.float8_round_scales is not None:
        changes["round_scales_to_power_of_2"] = c.float8_round_scales
    if where.auto:
        changes["emulate"] = Expr('device == "cpu"', where.value == "cpu")
    elif where.value == "cpu":
        changes["emulate"] = True
    return Named(name, Call("dataclasses:replace", (base,), changes) if changes else base)


def conversion(c: AmpConfig, where: Device, name: str = "float8_config") -> Call:
    """``convert_to_float8_training(model, config=..., module_filter_fn=...)``."""
    return Call(
        "torchao.float8:convert_to_float8_training",
        (MODEL,),
        {"config": float8_config(c, where, name), "module_filter_fn": float8_filter(c)},
    )


def emulate_note(where: Device) -> list[str]:
    """Where the code leaves ``emulate`` to torchao's default (False): a GPU needs float8
    matmuls then."""
    if where.value == "cpu" and not where.auto:
        return []
    return [
        "# a GPU without float8 matmuls (compute capability below 8.9: before Ada and Hopper)",
        "# needs emulate=True in the config: float8's numerics, not its speed",
    ]


def torchao(c: AmpConfig, where: Device, *, clip: bool = False) -> Parts:
    """torchao's objects (``config``, ``module_filter_fn``, the ``autocast`` around float8
    where it is bfloat16), the conversion, and the loop (``clip``: with ``max_norm``)."""
    convert = conversion(c, where, name="config")
    spec: dict[str, Any] = dict(convert.kwargs)
    if c.float8_around == "bfloat16":
        spec["autocast"] = {"device_type": where, "dtype": Name("torch:bfloat16")}
    if clip:
        spec["max_norm"] = c.clip_norm
    parts = Parts(spec, uses_device=where.auto or c.float8_around == "bfloat16")
    parts.model_calls.append(convert)
    parts.usage = [*emulate_note(where), "", "# for inputs, targets in loader:"]
    parts.usage.append("#     optimizer.zero_grad(set_to_none=True)")
    if c.float8_around == "bfloat16":
        parts.usage += [
            "#     with torch.autocast(**autocast):",
            "#         loss = loss_fn(model(inputs), targets)",
        ]
    else:
        parts.usage.append("#     loss = loss_fn(model(inputs), targets)  # no autocast")
    parts.usage.append("#     loss.backward()  # no loss scaler: float8 scales each tensor itself")
    if c.clip_norm is not None:
        norm = "max_norm" if clip else repr(c.clip_norm)
        parts.usage.append(f"#     torch.nn.utils.clip_grad_norm_(model.parameters(), {norm})")
    parts.usage.append("#     optimizer.step()")
    return parts


def accelerate(c: AmpConfig, where: Device) -> Parts:
    """Accelerate's float8 through torchao: ``mixed_precision="fp8"`` with ``AORecipeKwargs``.

    Accelerate's fp8 always autocasts to bfloat16 around the float8 layers
    (``get_mixed_precision_context_manager``); ``AutocastKwargs(enabled=False)`` turns that
    off for float32 around float8. Without a ``module_filter_func`` it would also leave the
    first and last Linear layers out of float8, which the search did not.
    """
    handler = Call(
        "accelerate.utils:AORecipeKwargs",
        (),
        {"config": float8_config(c, where), "module_filter_func": float8_filter(c)},
    )
    handlers = [handler]
    if c.float8_around == "float32":
        handlers.append(Call("accelerate.utils:AutocastKwargs", (), {"enabled": False}))
    spec: dict[str, Any] = {"mixed_precision": "fp8", "kwargs_handlers": handlers}
    if where.value == "cpu" and not where.auto:
        spec["cpu"] = True  # Accelerate would take the GPU if there is one
    parts = Parts(spec, name="accelerator_kwargs", uses_device=where.auto or bool(c.fp32_modules))
    parts.usage = [  # no emulate note: below 8.9 Accelerate leaves fp8 (the DIFFERS line)
        "# accelerator = accelerate.Accelerator(**accelerator_kwargs)",
        "# accelerator.prepare(model, ...) converts the model's Linear layers to float8",
        "# (module_filter_func replaces Accelerate's default, which also leaves the first and",
        "# last Linear layers out of float8)",
    ]
    if c.clip_norm is not None:
        parts.usage += [
            "# in the loop, between accelerator.backward(loss) and optimizer.step():",
            f"#     accelerator.clip_grad_norm_(model.parameters(), {c.clip_norm!r})",
        ]
    if emulate_note(where):
        parts.differ.append(
            "on a GPU of compute capability below 8.9 Accelerate turns mixed_precision 'fp8' "
            "into 'fp16' (float16 autocast and a GradScaler around the float8 layers): train "
            "there with the torchao export and emulate=True"
        )
    return parts


def around(c: AmpConfig) -> AmpConfig:
    """The config of the precision around float8: what a framework without float8 of its own
    (Lightning, Transformers) is set to, while torchao converts the model."""
    return AmpConfig(dtype=c.float8_around, clip_norm=c.clip_norm, fp32_modules=c.fp32_modules)


def converted_before(parts: Parts, c: AmpConfig, where: Device, before: str) -> None:
    """``parts`` of a framework that trains the model torchao converts: the conversion, and
    the line that says it comes first."""
    parts.model_calls.append(conversion(c, where))
    parts.uses_device = parts.uses_device or where.auto
    parts.usage = [
        f"# float8: torchao converts the model's Linear layers (the lines above) {before}",
        *emulate_note(where),
        *parts.usage,
    ]
