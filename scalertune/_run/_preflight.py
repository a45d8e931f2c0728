"""One float32 step before any study row exists: a bad workload is refused in one line."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch

from scalertune._amp._config import AmpConfig
from scalertune._amp._fingerprint import fingerprint
from scalertune._amp._float8 import left_out, not_linear
from scalertune._amp._runtime import AmpRuntime
from scalertune._errors import UsageError
from scalertune._inrun._float8_layers import LayerCast, layer_casts, record_inputs
from scalertune._inrun._replicas import Replicas, copies_line
from scalertune._run._loop import loss_function, step_function
from scalertune._workload._contract import to_device
from scalertune._workload._deepspeed import engine_facts
from scalertune._workload._factory import build_workload
from scalertune._workload._loader import one_line


def check_loss(loss: Any, output: Any = None) -> None:
    """A step's result must be a scalar tensor; say so in one line otherwise (``output``, the
    model's output that ``loss_fn`` was given, tells a Hugging Face model's apart)."""
    if isinstance(loss, (tuple, list)):
        raise UsageError(
            f"the step returned a {type(loss).__name__} of {len(loss)}, not the loss: return "
            "the scalar loss tensor alone (e.g. `_, loss = model(x, y)` ... `return loss`, "
            "not `return logits, loss`)"
        )
    if not isinstance(loss, torch.Tensor):
        raise UsageError(
            f"the loss is a {type(loss).__name__}, not a tensor: loss_fn (or step) must "
            f"return the scalar loss tensor{_model_output_hint(output)}"
        )
    if loss.dim() != 0:
        raise UsageError(
            f"the loss has shape {tuple(loss.shape)}, not a scalar: reduce it "
            "(e.g. reduction='mean') before returning it"
        )


@dataclasses.dataclass(frozen=True)
class Checked:
    """What the first float32 step found out about the workload."""

    #: The float32 reference's config: float32, clipped as the workload asks.
    reference: AmpConfig
    #: The horizon the workload declares (the steps its training runs), if any.
    horizon: int | None
    #: For a DeepSpeed workload, the engine it trains in: its ZeRO stage, and whether the
    #: device runs bfloat16 (see :func:`~scalertune._workload._deepspeed.engine_facts`).
    deepspeed: Mapping[str, Any] | None = None
    #: The model's fingerprint (``_amp._fingerprint``), which the result file carries.
    model: dict[str, Any] | None = None
    #: The Linear layers float8 leaves out for their sizes (``_amp._float8.left_out``), where
    #: the space searches float8.
    float8_left_out: tuple[str, ...] = ()
    #: The matmul layers float8 leaves out for their class, each with it
    #: (``_amp._float8.not_linear``), where the space searches float8.
    float8_not_linear: tuple[tuple[str, str], ...] = ()
    #: What each of the space's float8 recipes costs each Linear layer on the first batch.
    float8_casts: tuple[LayerCast, ...] = ()
    #: How many Linear layers float8 takes ran in the first step (where the space tries it).
    float8_layers: int = 0


def preflight(
    factory: Callable[[], Any],
    *,
    device: torch.device,
    seed: int,
    islands: Collection[str] = frozenset(),
    float8_recipes: Collection[str] = (),
    independent_ranks: bool = False,
) -> Checked:
    """One float32 step on a fresh workload: catches a bad loss before any study row exists.

    Also checks that every module named in ``islands`` exists, and, with ``float8_recipes``
    (a space's), finds the Linear layers float8 leaves out and what each recipe costs the
    others on that step's inputs (:mod:`~scalertune._inrun._float8_layers`). On ranks, their
    copies of the model must be one model after the step, unless ``independent_ranks``.
    """
    workload = build_workload(factory, seed=seed, device=device)
    AmpRuntime(AmpConfig(fp32_modules=tuple(sorted(islands))), device=device).prepare(
        workload.model
    )
    amp = AmpRuntime(AmpConfig(dtype="float32"), device=device)
    replicas = Replicas([workload.model])
    amp.hooks.before_step(replicas.grads_ready)
    batch = to_device(next(iter(workload.batches)), device)
    with record_inputs(workload.model, enabled=bool(float8_recipes)) as recorded:
        loss = _first_step(workload, batch, amp)
    check_loss(loss)
    if not bool(torch.isfinite(loss)):
        raise UsageError(
            f"the loss is {loss.item()} on the first batch, in float32 with the initial "
            "weights, before any optimizer step: the model's forward, the loss function or "
            "the data produce it (check the batches for NaN/inf, and the loss for a log or "
            "division of zero)"
        )
    if workload.step is not None and amp.steps == 0:
        raise UsageError(
            "the step function never called amp.step(optimizer): call amp.backward(loss) "
            "and amp.step(optimizer) so the scaler and clipping run"
        )
    differing = [] if independent_ranks else replicas.differing()
    if differing:  # a copy per rank: every figure would be about a run nobody trains
        raise UsageError(
            copies_line(differing, when="after one step", what="gradients and weights")
            + "; --independent-ranks if the copies are meant (an ensemble)"
        )
    return Checked(
        reference=AmpConfig(dtype="float32", clip_norm=workload.clip_norm),
        horizon=workload.horizon,
        deepspeed=engine_facts(workload),
        model=fingerprint(workload.model),
        float8_left_out=tuple(left_out(workload.model)) if float8_recipes else (),
        float8_not_linear=tuple(not_linear(workload.model)) if float8_recipes else (),
        float8_layers=len(recorded),
        float8_casts=tuple(
            c
            for recipe in float8_recipes
            for c in layer_casts(
                recorded, AmpConfig(dtype="float8", float8_recipe=recipe), device=device
            )
        ),
    )


def _first_step(workload: Any, batch: Any, amp: AmpRuntime) -> Any:
    """The workload's first float32 step; the user's error in one line."""
    try:
        if workload.step is None:
            inputs, targets = batch
            output = workload.model(inputs)
            check_loss(loss_function(workload)(output, targets), output)
        # the user's step called as it is, so that what it returns is checked before use
        return (
            workload.step(workload.model, batch, amp)
            if workload.step is not None
            else step_function(workload)(workload, batch, amp)
        )
    except UsageError:
        raise
    except Exception as exc:  # the user's model, loss or step: theirs to fix
        raise UsageError(f"the first float32 training step failed: {one_line(exc)}") from None


def _model_output_hint(output: Any) -> str:
    """Why a Hugging Face model's output gave no loss, and the two ways out."""
    if not (hasattr(output, "logits") or (isinstance(output, Mapping) and "logits" in output)):
        return ""
    return (
        "; the model returned a Hugging Face output, whose loss is None unless the model "
        "is given labels (scalertune calls model(inputs) with each batch's first "
        "element): compute the loss from output.logits in loss_fn, or give a step "
        "function that calls model(input_ids=..., labels=...)"
    )
