"""A Hugging Face Trainer's internals, in one place: the steps of ``Trainer.train()`` that a
search takes one by one, and what it sets on a Trainer.

``Trainer.train()`` is one long method; a search runs its steps itself, through the methods
``train()`` calls, so that a subclass's overrides (TRL's trainers, a ``compute_loss`` of your
own) are what runs. Those methods are public but undocumented, and their signatures move
between releases. Each entry below is checked against the installed transformers by
``tests/unit/test_frameworks_private.py``, and ``pyproject.toml`` bounds transformers (and
TRL, whose trainers override some of them) to the releases those tests passed on
(:data:`RELEASES`, :data:`TRL_RELEASES`, checked again by :func:`check` when a Trainer is
handed over). The Trainer's Accelerator is Accelerate's, whose internals (the sync flag that
``train()`` sets on it among them) are listed in ``_accelerate_private``. What is relied on:

- :data:`TRAIN_STEPS`, called in ``train()``'s order with ``train()``'s arguments:
  ``get_train_dataloader()``, ``set_initial_training_values(args, dataloader)`` (its last
  value is ``max_steps``), ``create_optimizer()``, ``create_scheduler(num_training_steps=,
  optimizer=)``, ``get_batch_samples(iterator, n, device)`` (the micro-batches of a step and
  the number of items in them) and ``training_step(model, inputs, num_items_in_batch)``;
- :data:`SET`, what ``train()`` sets as it goes and a step reads: the micro-batches of the
  current step (``current_gradient_accumulation_steps``, which ``training_step`` divides the
  loss by), ``state.global_step`` and ``state.max_steps``, and ``args.max_grad_norm`` (set by
  ``attach`` to the config's clipping);
- :data:`READ`: ``accelerator``, ``is_deepspeed_enabled``, ``is_fsdp_enabled``, ``model``;
- :data:`CALLBACKS`: the list the Trainer's callbacks run in, where ``attach`` puts the
  runtime's checkpoint saver first (:func:`add_first`);
- the model's ``forward``, replaced on the model itself (``_route.Route.wrap_forward``);
- a Trainer made with ``deepspeed=``: ``transformers.integrations.deepspeed.deepspeed_init``
  (:data:`DEEPSPEED_INIT`), which ``train()`` calls for the optimizer and scheduler before
  ``accelerator.prepare`` makes the engine (:func:`deepspeed_init`); the ``_dtype`` of the
  ``HfTrainerDeepSpeedConfig`` the Trainer puts on its Accelerator's DeepSpeed plugin
  (``hf_ds_config``), which the Trainer's ``_prepare_inputs`` casts floating inputs to
  (:func:`set_input_dtype`); and what ``train()`` sets once the engine is made
  (:data:`DEEPSPEED_SET`: ``model_wrapped`` and ``deepspeed``, :func:`set_engine`). The
  plugin itself, its config and the engine ``prepare`` made are Accelerate's
  (``_accelerate_private``).
"""

from __future__ import annotations

from typing import Any

from scalertune._frameworks import _accelerate_private
from scalertune._frameworks._releases import Releases, comes_from, has_path, importable

RELEASES = Releases("transformers", (4, 40), (5, 26), checked="5.25")
#: TRL's trainers subclass the Trainer and override some of its steps.
TRL_RELEASES = Releases("trl", (0, 19), (1, 17), checked="1.16")

#: The methods of ``train()`` a search calls, in ``train()``'s order.
TRAIN_STEPS = (
    "get_train_dataloader",
    "set_initial_training_values",
    "create_optimizer",
    "create_scheduler",
    "get_batch_samples",
    "training_step",
)
#: What a search sets on the Trainer, as ``train()`` does.
SET = (
    "current_gradient_accumulation_steps",
    "state.global_step",
    "state.max_steps",
    "args.max_grad_norm",
)
#: What is read of the Trainer.
READ = ("accelerator", "is_deepspeed_enabled", "is_fsdp_enabled", "model")
#: The Trainer's callbacks, in the order its events run them: the runtime's own saver goes
#: first, so that a checkpoint is whole (with the runtime's state) when a user's ``on_save``
#: copies it away.
CALLBACKS = "callback_handler.callbacks"
#: What ``train()`` sets on a Trainer made with ``deepspeed=`` once the engine is made.
DEEPSPEED_SET = ("model_wrapped", "deepspeed")
#: What ``train()`` makes a DeepSpeed engine's optimizer and scheduler with: (module, name).
DEEPSPEED_INIT = ("transformers.integrations.deepspeed", "deepspeed_init")


def check(trainer: Any) -> None:
    """Refuse, in one line, a transformers (or TRL) release outside the bound, or one whose
    Trainer lacks a name listed here; then its Accelerator's (``_accelerate_private``)."""
    RELEASES.check()
    if comes_from(trainer, "trl"):
        TRL_RELEASES.check()
    missing = [n for n in (*TRAIN_STEPS, *READ) if not hasattr(trainer, n)]
    missing += [n for n in SET if "." in n and not has_path(trainer, n.rpartition(".")[0])]
    if missing:
        raise RELEASES.missing([f"Trainer.{n}" for n in missing])
    _accelerate_private.check(trainer.accelerator)


def add_first(trainer: Any, callback: Any) -> None:
    """``callback`` among the Trainer's callbacks, first to run (:data:`CALLBACKS`; added
    last where the Trainer keeps them otherwise)."""
    trainer.add_callback(callback)
    owner, _, name = CALLBACKS.rpartition(".")
    callbacks = getattr(getattr(trainer, owner, None), name, None)
    if isinstance(callbacks, list) and callbacks and callbacks[-1] is callback:
        callbacks.insert(0, callbacks.pop())


def check_deepspeed(trainer: Any) -> None:
    """Refuse, in one line, a Trainer made with ``deepspeed=`` whose transformers (or
    Accelerate) release lacks a name listed here for it; the releases themselves are checked
    by :func:`check`."""
    missing = [n for n in DEEPSPEED_SET if not hasattr(trainer, n)]
    if not importable(*DEEPSPEED_INIT):
        missing.append(".".join(DEEPSPEED_INIT))
    plugin = _accelerate_private.deepspeed_plugin(trainer.accelerator)
    if not hasattr(getattr(plugin, "hf_ds_config", None), "_dtype"):
        missing.append("HfTrainerDeepSpeedConfig._dtype")
    if missing:
        raise RELEASES.missing(missing)
    _accelerate_private.check_deepspeed(trainer.accelerator)


def deepspeed_init(trainer: Any, max_steps: int) -> tuple[Any, Any]:
    """The optimizer and scheduler ``train()`` makes before ``accelerator.prepare`` makes the
    engine (the scheduler may be one the config names: Accelerate's ``DummyScheduler``)."""
    from transformers.integrations.deepspeed import deepspeed_init as hf_deepspeed_init

    optimizer, scheduler = hf_deepspeed_init(trainer, num_training_steps=max_steps)
    return optimizer, scheduler


def set_input_dtype(trainer: Any, dtype: Any) -> None:
    """What a DeepSpeed Trainer's ``_prepare_inputs`` casts floating inputs to."""
    plugin = _accelerate_private.deepspeed_plugin(trainer.accelerator)
    plugin.hf_ds_config._dtype = dtype  # noqa: SLF001 - read by the Trainer's _prepare_inputs


def set_engine(trainer: Any, engine: Any) -> None:
    """What ``train()`` sets once the DeepSpeed engine is made (:data:`DEEPSPEED_SET`)."""
    trainer.model_wrapped = trainer.deepspeed = engine
