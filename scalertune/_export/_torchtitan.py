"""A float8 config as torchtitan's own settings: its float8 converter's config and the
``training`` fields around it.

torchtitan 0.3.0 has no TOML job file: a job is a Python function of a model's
``config_registry`` that returns a ``Trainer.Config``, and float8 is a model converter,
``Float8LinearConverter.Config(recipe_name=..., filter_fqns=..., emulate=...)`` in the
``converters`` of ``model_registry(flavor, converters=[...])``. Its converter keeps a Linear
layer out of float8 when its name *contains* an entry of ``filter_fqns`` (no glob patterns),
or when a size is not a multiple of 16. The precision around float8 is
``training.mixed_precision_param``, which torchtitan applies through FSDP's
``MixedPrecisionPolicy`` (on one GPU too): parameters cast to bfloat16, not autocast. It clips
at ``training.max_norm``, 1.0 unless set.

Example:
    >>> import scalertune
    >>> config = scalertune.AmpConfig(dtype="float8", float8_recipe="rowwise")
    >>> for line in scalertune.export(config, "torchtitan").code.splitlines()[3:5]:
    ...     print(line)
    float8_converter = Float8LinearConverter.Config(recipe_name='rowwise')
    training = {'mixed_precision_param': 'float32', 'max_norm': float("inf")}
"""

from __future__ import annotations

import math
import re
from typing import Any

from scalertune._amp._config import AmpConfig
from scalertune._amp._modules import is_pattern
from scalertune._export._code import Call, Device, Expr, Parts

#: The release whose config fields this writes (``tests/unit/test_export_float8.py`` reads
#: them from the installed package).
CHECKED = "0.3.0"

#: torchao's ``round_scales_to_power_of_2`` of each recipe's config (``from_recipe_name``):
#: torchtitan has no field for it, so only this value is expressible.
RECIPE_ROUNDS_SCALES = {"tensorwise": False, "rowwise": True, "rowwise_with_gw_hp": True}

#: The recipes torchtitan's ``recipe_name`` declares (its ``Literal``); its converter hands any
#: name to torchao's ``from_recipe_name``, which takes ``tensorwise`` too.
DECLARED_RECIPES = ("rowwise", "rowwise_with_gw_hp")

CONVERTER = "torchtitan.components.quantization:Float8LinearConverter.Config"


def torchtitan(c: AmpConfig, where: Device) -> Parts:
    """torchtitan's ``float8_converter`` and ``training`` fields of ``c``."""
    parts = Parts({}, uses_device=False)
    kwargs: dict[str, Any] = {"recipe_name": c.float8_recipe}
    fqns = _filter_fqns(c, parts)
    if fqns:
        kwargs["filter_fqns"] = fqns
    if where.value == "cpu" and not where.auto:
        kwargs["emulate"] = True
        if c.float8_recipe != "tensorwise":
            parts.lost.append(
                f"recipe {c.float8_recipe} on a CPU: torchtitan's emulate=True trains torchao's "
                "default tensorwise recipe whatever recipe_name says"
            )
    if c.float8_round_scales not in (None, RECIPE_ROUNDS_SCALES[c.float8_recipe]):
        parts.lost.append(
            f"round_scales_to_power_of_2={c.float8_round_scales}: torchtitan has no field for "
            f"it and keeps the recipe's own ({RECIPE_ROUNDS_SCALES[c.float8_recipe]})"
        )
    no_clip = Expr('float("inf")', math.inf)
    parts.spec = {
        "float8_converter": Call(CONVERTER, (), kwargs),
        "training": {
            "mixed_precision_param": c.float8_around,
            "max_norm": no_clip if c.clip_norm is None else c.clip_norm,
        },
    }
    if c.float8_around == "bfloat16":
        parts.differ.append(
            "mixed_precision_param bfloat16 is FSDP's MixedPrecisionPolicy in torchtitan (on "
            "one GPU too): parameters are cast to bfloat16 instead of autocast, so ops "
            "autocast keeps in float32 (softmax, norms, losses) run in bfloat16 unless the "
            "model upcasts"
        )
    parts.usage = _usage(c, where)
    return parts


def _filter_fqns(c: AmpConfig, parts: Parts) -> list[str]:
    """``filter_fqns`` for the islands: names as they are, a glob pattern as the text after
    its last wildcard (before its first where it ends in one), as torchtitan matches by
    substring."""
    fqns = []
    for island in c.fp32_modules:
        if not is_pattern(island):
            fqns.append(island)
            continue
        runs = re.split(r"\*|\?|\[[^\]]*\]", island)
        literal = runs[-1] or runs[0]  # the tail names a kind of layer: '*.attn.wo'
        parts.lost.append(
            f"fp32_modules pattern {island!r}: filter_fqns takes no patterns; "
            + (
                f"nearest: {literal!r}, every layer whose name contains it"
                if literal
                else "left out: list the module names instead"
            )
        )
        if literal:
            fqns.append(literal)
    if fqns:
        parts.differ.append(
            "filter_fqns leaves out of float8 every Linear layer whose name contains an entry "
            "('head' would catch 'lm_head' too), where fp32_modules names one module"
        )
    if c.fp32_modules and c.float8_around == "bfloat16":
        parts.lost.append(
            f"fp32_modules {list(c.fp32_modules)} in float32: torchtitan casts every parameter "
            "to bfloat16 and only keeps these layers out of float8"
        )
    return fqns


def _usage(c: AmpConfig, where: Device) -> list[str]:
    clip = 'float("inf")  # torchtitan clips at 1.0 unless told' if c.clip_norm is None else ""
    lines = [
        f"# torchtitan {CHECKED} reads no TOML: in your model's config_registry function,",
        '#     config.model_spec = model_registry("FLAVOR", converters=[float8_converter])',
        f"#     config.training.mixed_precision_param = {c.float8_around!r}",
        f"#     config.training.max_norm = {clip or repr(c.clip_norm)}",
        "# (the training fields are on its command line too: --training.mixed_precision_param "
        f"{c.float8_around})",
    ]
    if where.value != "cpu" or where.auto:
        lines += [
            "# a GPU without float8 matmuls needs emulate=True, with which torchtitan trains",
            "# torchao's default tensorwise recipe whatever recipe_name says",
        ]
    if c.float8_recipe not in DECLARED_RECIPES:
        lines += [
            f"# recipe_name {c.float8_recipe!r} is outside the names torchtitan declares "
            f"({', '.join(DECLARED_RECIPES)}):",
            "# a type checker flags it; its converter hands it to torchao, which takes it",
        ]
    return lines
