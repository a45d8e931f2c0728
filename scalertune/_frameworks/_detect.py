"""Which framework's trainer an object is: the one test that ``attach`` and the search's
trainer workloads make, with the check of the framework's release it comes with; and the one
refusal of a trainer that runs DeepSpeed, whichever framework runs it.

The answer comes from the object's classes alone (a subclass's included: TRL's trainers are
Hugging Face Trainers), so no framework is imported to ask. A framework recognised is checked
at once (``_transformers_private``, ``_lightning_private``, ``_accelerate_private``): a
release outside the bound scalertune was checked on, or one without a name it relies on, is
refused in one line before anything trains.
"""

from __future__ import annotations

from typing import Any, NoReturn

from scalertune._errors import UsageError
from scalertune._frameworks import _accelerate_private, _lightning_private, _transformers_private
from scalertune._frameworks._releases import defining_package

#: What :func:`trainer_framework` answers.
TRANSFORMERS, LIGHTNING, ACCELERATE = "transformers", "lightning", "accelerate"


def trainer_framework(obj: Any) -> str | None:
    """``"transformers"`` for a Hugging Face ``Trainer``, ``"lightning"`` for a Lightning
    ``Trainer``, ``"accelerate"`` for an ``Accelerator``; ``None`` for anything else."""
    package = defining_package(obj, "Trainer")
    if package == "transformers":
        _transformers_private.check(obj)
        return TRANSFORMERS
    if package in ("lightning", "pytorch_lightning"):
        _lightning_private.check(obj, "Trainer")
        return LIGHTNING
    if defining_package(obj, "Accelerator") == "accelerate":
        _accelerate_private.check(obj)
        return ACCELERATE
    return None


def refuse_deepspeed(what: str) -> NoReturn:
    """The one refusal of a trainer (``what``) that runs DeepSpeed (an Accelerator, a Hugging
    Face Trainer, a Lightning Trainer): its fp16 mode has a loss scaler of its own, which the
    runtime's cannot take the place of."""
    raise UsageError(
        f"{what} runs DeepSpeed, whose fp16 mode has its own loss scaler: "
        "export the config with scalertune export --to deepspeed instead"
    )
