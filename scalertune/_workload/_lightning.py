"""Searching from inside Lightning: a LightningModule's own ``training_step``, unchanged.

``lightning_workload(module, batches)`` turns a LightningModule into a scalertune Workload
whose step runs ``module.training_step`` under the trial's autocast and scaler, with the
optimizer and LR schedulers from ``module.configure_optimizers()``, stepped as Lightning's
training loop steps them. A factory that returns a Lightning ``Trainer`` with its module and
data (:func:`lightning_trainer_workload`) gets the same, with the Trainer's ``max_steps``,
``max_epochs``, ``accumulate_grad_batches`` and ``gradient_clip_val``. No Trainer runs: each
trial is the same training_step, optimizer, schedule and data under a different AMP config.
Lightning steps its LR schedulers after every optimizer step, a skipped one included (its
loop does not ask the scaler), and so does this. ``self.trainer`` is a stand-in that holds what
training code commonly reads from a Trainer (the step and epoch counters, ``max_steps``,
``estimated_stepping_batches``, the optimizers, the logged metrics); anything else raises an
``AttributeError`` that names the attribute.

Why a stand-in and not ``Trainer.fit()`` under the precision plugin ``attach`` sets (the same
adapter as training): a search owns its runs' steps (each batch once, in order; a run that
starts at step k from the float32 reference's checkpoint; a run that stops at the end of any
window), and ``fit()`` owns its loop, whose state at step k is Lightning's private loop state.
Measured (``benchmarks/lightning_fit.py``, the tests' module, 30 float16 steps): ``fit()``
took 1.7x (1.3-2.6x) the time per step of this loop. The loop is held to ``fit()`` instead:
``tests/unit/test_frameworks.py`` checks its float32 losses against ``fit()``'s step for step,
and its float16 skips against ``fit()`` with Lightning's own ``MixedPrecision``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from scalertune._amp._device import check_same_device
from scalertune._errors import UsageError
from scalertune._frameworks import _lightning_private
from scalertune._frameworks._lightning import check_lightning, lightning_device
from scalertune._workload._contract import Workload
from scalertune._workload._groups import Groups

#: What a Trainer with neither max_steps nor max_epochs runs (Lightning's own default).
_LIGHTNING_DEFAULT_MAX_EPOCHS = 1000

_PRECISION = {"float16": "16-mixed", "bfloat16": "bf16-mixed", "float32": "32-true"}


def lightning_workload(
    module: Any,
    batches: Iterable[Any],
    *,
    max_steps: int = -1,
    max_epochs: int | None = None,
    accumulate_grad_batches: int = 1,
    clip_norm: float | None = None,
) -> Workload:
    """A Workload that trains ``module`` (a LightningModule) through its ``training_step``.

    The factory of a search returns it: each trial runs the module's own ``training_step``,
    optimizer and LR schedulers (from ``configure_optimizers()``) under the trial's autocast
    and scaler, stepped as Lightning's training loop steps them. Each step takes
    ``accumulate_grad_batches`` batches (the last of a pass over ``batches`` what is left),
    each loss divided by it before backward, as Lightning does. Schedulers are stepped as
    Lightning steps them: ``interval`` "step" after every ``frequency``-th batch of an epoch,
    "epoch" after every ``frequency``-th epoch (an epoch is one pass over ``batches``), and
    ``ReduceLROnPlateau`` with the last value ``training_step`` logged under its
    ``monitor``. ``self.trainer`` is a stand-in holding what training code commonly reads of
    a Trainer; anything else raises an ``AttributeError`` naming the attribute.

    Args:
        module: A LightningModule with automatic optimization and one optimizer.
        batches: What its ``training_step`` takes, batch by batch (a DataLoader, a list).
        max_steps: Your Trainer's ``max_steps`` (-1, Lightning's default: none): with
            ``max_epochs``, a schedule built from ``self.trainer.estimated_stepping_batches``
            (``OneCycleLR``, warm-up then decay) has the length it has in real training.
        max_epochs: Your Trainer's ``max_epochs`` (``None``: Lightning's 1000 where
            ``max_steps`` is -1 too).
        accumulate_grad_batches: Your Trainer's ``accumulate_grad_batches``.
        clip_norm: Your Trainer's ``gradient_clip_val`` (by norm); ``None`` for none.

    Returns:
        The :class:`Workload`; the search sees its first ``steps`` optimizer steps.

    Raises:
        UsageError: ``module`` is not a LightningModule, turns automatic optimization off
            (give a :class:`Workload` with a ``step`` function instead), returns other than
            one optimizer from ``configure_optimizers()``, ``accumulate_grad_batches`` is not
            a positive integer, or the Lightning release is outside the bounds scalertune was
            checked with.

    Example:
        >>> import scalertune
        >>> def make_model():
        ...     module = MyLightningModule()
        ...     return scalertune.lightning_workload(
        ...         module, my_datamodule.train_dataloader(), max_epochs=10)
        >>> workload = make_model()  # doctest: +SKIP
    """
    _check_module(module, accumulate_grad_batches)
    trainer = _TrainerView(
        module,
        batches,
        max_steps=max_steps,
        max_epochs=max_epochs,
        accumulate=accumulate_grad_batches,
    )
    module.trainer = trainer
    optimizer = _configured_optimizer(module, trainer)
    return Workload(
        model=module,
        optimizer=optimizer,
        step=_step(trainer, optimizer),
        clip_norm=clip_norm,
        batches=Groups(
            batches,
            accumulate_grad_batches,
            on_epoch=functools.partial(_set_sampler_epoch, batches),
        ),
        schedulers=[trainer],
    )


def _check_module(module: Any, accumulate_grad_batches: Any) -> None:
    """:class:`UsageError` for what :func:`lightning_workload` cannot train."""
    if _lightning_private.package(module, "LightningModule") is None:
        raise UsageError(
            f"lightning_workload needs a LightningModule, got a {type(module).__name__}: "
            "for a plain nn.Module return a Workload (model, optimizer, batches, loss_fn)"
        )
    _lightning_private.check(module, "LightningModule")
    if not module.automatic_optimization:
        raise UsageError(
            f"{type(module).__name__} sets automatic_optimization = False: lightning_workload "
            "runs Lightning's automatic optimization only; return a Workload with a "
            "step(model, batch, amp) function that calls amp.backward and amp.step instead"
        )
    if (
        isinstance(accumulate_grad_batches, bool)
        or not isinstance(accumulate_grad_batches, int)
        or accumulate_grad_batches < 1
    ):
        raise UsageError(
            f"accumulate_grad_batches must be a positive integer, got {accumulate_grad_batches!r}"
        )


def _configured_optimizer(module: Any, trainer: _TrainerView) -> Any:
    """The one optimizer of ``configure_optimizers()``, its schedulers given to ``trainer``.
    Lightning's own parsing: every return shape it accepts, with its defaults for interval
    ("epoch") and frequency (1), and its errors for bad ones."""
    try:
        optimizers, trainer.lr_scheduler_configs = _lightning_private.configured_optimizers(module)
    except Exception as exc:  # MisconfigurationException, from the module's return value
        raise UsageError(f"configure_optimizers(): {str(exc).strip().splitlines()[0]}") from None
    if len(optimizers) != 1:
        raise UsageError(
            f"configure_optimizers() returned {len(optimizers)} optimizers: "
            "automatic optimization trains with exactly one"
        )
    trainer.optimizers = [optimizers[0]]
    return optimizers[0]


def _step(trainer: _TrainerView, optimizer: Any) -> Any:
    """One optimizer step as Lightning's automatic optimization takes it: each micro-batch's
    ``training_step`` under autocast, its loss divided by the accumulation, then the step."""

    def step(model: Any, group: list[Any], amp: Any) -> torch.Tensor:
        trainer.precision = _PRECISION[amp.config.dtype]
        optimizer.zero_grad(set_to_none=True)
        losses = []
        for batch in group:
            with amp.autocast():
                out = model.training_step(batch, trainer.batch_idx)
            loss = out["loss"] if isinstance(out, Mapping) else out
            amp.backward(loss / trainer.accumulate_grad_batches)
            losses.append(loss.detach())
            trainer.batch_idx += 1
        amp.step(optimizer)
        trainer.advance()
        return losses[0] if len(losses) == 1 else torch.stack(losses).mean()

    return step


def lightning_trainer_workload(
    trainer: Any, module: Any, data: Any, *, device: torch.device, horizon: int | None = None
) -> Workload:
    """What ``trainer.fit(module, data)`` trains, as a Workload (``data``: a dataloader, or a
    LightningDataModule, whose ``train_dataloader()`` is taken as ``fit`` takes it)."""
    check_lightning(trainer)
    check_same_device(
        "the Trainer", lightning_device(trainer), device, "or the Trainer's accelerator to match"
    )
    clip = trainer.gradient_clip_val
    if clip and str(trainer.gradient_clip_algorithm or "norm").lower() != "norm":
        raise UsageError(
            "the Trainer clips gradients by value (gradient_clip_algorithm="
            "'value'): scalertune searches the clipping norm; clip by norm"
        )
    if hasattr(data, "train_dataloader") and hasattr(data, "setup"):  # a LightningDataModule
        data.prepare_data()
        data.setup("fit")
        data = data.train_dataloader()
    workload = lightning_workload(
        module,
        data,
        max_steps=trainer.max_steps,
        max_epochs=trainer.max_epochs,
        accumulate_grad_batches=trainer.accumulate_grad_batches,
        clip_norm=float(clip) if clip else None,
    )
    estimate = module.trainer.estimated_stepping_batches
    workload.horizon = horizon or (int(estimate) if math.isfinite(estimate) else None)
    return workload


def _set_sampler_epoch(loader: Any, epoch: int) -> None:
    """What Lightning's fit loop tells a dataloader's samplers before each epoch."""
    for sampler in ("sampler", "batch_sampler"):
        found = getattr(loader, sampler, None)
        if found is not None and hasattr(found, "set_epoch"):
            found.set_epoch(epoch)


class _TrainerView:
    """What training code reads from ``self.trainer``, for a module trained without one."""

    # A single process on one device.
    world_size = num_devices = num_nodes = 1
    global_rank = local_rank = node_rank = 0
    is_global_zero = training = True
    sanity_checking = validating = testing = predicting = should_stop = False
    logger = datamodule = progress_bar_callback = None

    def __init__(
        self,
        module: Any,
        batches: Iterable[Any],
        *,
        max_steps: int,
        max_epochs: int | None,
        accumulate: int,
    ) -> None:
        self.lightning_module = self.model = module
        self.accumulate_grad_batches = accumulate
        self.train_dataloader = batches
        self.max_steps = max_steps
        if max_epochs is None:
            max_epochs = _LIGHTNING_DEFAULT_MAX_EPOCHS if max_steps == -1 else -1
        self.max_epochs = max_epochs
        try:
            self.num_training_batches: float = len(batches)  # type: ignore[arg-type]
        except TypeError:  # an iterable without a length is one endless epoch, as in Lightning
            self.num_training_batches = math.inf
        self.global_step = self.current_epoch = self.batch_idx = 0
        self.precision = "32-true"
        self.optimizers: list[torch.optim.Optimizer] = []
        self.lr_scheduler_configs: list[Any] = []
        self.loggers: list[Any] = []
        self.callback_metrics: dict[str, Any] = {}
        self.logged_metrics = self.progress_bar_metrics = self.callback_metrics
        self.strategy = _StrategyView(self)
        module.log = self._log
        module.log_dict = self._log_dict

    @property
    def estimated_stepping_batches(self) -> float:
        """Lightning's formula, for one device."""
        if self.max_epochs == -1:
            return math.inf if self.max_steps == -1 else self.max_steps
        if self.num_training_batches == math.inf:
            return self.max_steps
        per_epoch = math.ceil(self.num_training_batches / self.accumulate_grad_batches)
        estimate = per_epoch * max(self.max_epochs, 1)
        return min(estimate, self.max_steps) if self.max_steps != -1 else estimate

    def _log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        self.callback_metrics[name] = value.detach() if isinstance(value, torch.Tensor) else value

    def _log_dict(self, dictionary: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        for name, value in dictionary.items():
            self._log(name, value)

    def advance(self) -> None:
        """After an optimizer step (``batch_idx`` past its last batch): count it, step the
        schedulers that are due, and close the epoch at the end of ``batches``, in the order
        Lightning's training loop does."""
        self.global_step += 1
        epoch_ends = self.batch_idx >= self.num_training_batches
        for plateau in (False, True):
            for config in self.lr_scheduler_configs:
                if config.reduce_on_plateau != plateau:
                    continue
                due = (
                    self.batch_idx
                    if config.interval == "step"
                    else self.current_epoch + 1
                    if epoch_ends
                    else None
                )
                if due is not None and due % config.frequency == 0:
                    self._step_scheduler(config)
        if epoch_ends:
            self.current_epoch += 1
            self.batch_idx = 0

    def state_dict(self) -> dict[str, Any]:
        """The loop's counters and its schedulers' states: what a checkpoint restarts from."""
        return {
            "global_step": self.global_step,
            "current_epoch": self.current_epoch,
            "batch_idx": self.batch_idx,
            "schedulers": [c.scheduler.state_dict() for c in self.lr_scheduler_configs],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step, self.current_epoch, self.batch_idx = (
            state["global_step"],
            state["current_epoch"],
            state["batch_idx"],
        )
        for config, saved in zip(self.lr_scheduler_configs, state["schedulers"]):
            config.scheduler.load_state_dict(saved)

    def _step_scheduler(self, config: Any) -> None:
        metric = None
        if config.reduce_on_plateau:
            metric = self.callback_metrics.get(config.monitor)
            if metric is None:
                if not config.strict:
                    return
                raise UsageError(
                    f"ReduceLROnPlateau monitors {config.monitor!r}, which training_step has not "
                    f"logged (logged: {', '.join(self.callback_metrics) or 'nothing'}): "
                    "self.log it in training_step"
                )
        with warnings.catch_warnings():
            # A step GradScaler skipped is what a search is for; torch warns about it when the
            # very first optimizer step was skipped, as it would under a Trainer.
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            self.lightning_module.lr_scheduler_step(config.scheduler, metric)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"self.trainer.{name}: lightning_workload trains without a Trainer and offers "
            "global_step, current_epoch, max_steps, max_epochs, estimated_stepping_batches, "
            "num_training_batches, optimizers, lr_scheduler_configs, callback_metrics, precision "
            "and the rank and device counts; read it outside training_step, or pass a step "
            "function instead"
        )


class _StrategyView:
    """``self.trainer.strategy`` as far as ``LightningModule.optimizers()`` reads it
    (``_lightning_private.STRATEGY_OPTIMIZERS``)."""

    def __init__(self, trainer: _TrainerView) -> None:
        self._trainer = trainer

    @property
    def root_device(self) -> torch.device:
        return next(self._trainer.lightning_module.parameters()).device

    def __getattr__(self, name: str) -> Any:
        if name == _lightning_private.STRATEGY_OPTIMIZERS:
            return self._trainer.optimizers
        raise AttributeError(
            f"self.trainer.strategy.{name}: lightning_workload trains without a Trainer's "
            "strategy (it offers root_device, and self.optimizers()); read it outside "
            "training_step, or pass a step function instead"
        )
