"""AmpRuntime: the canonical AMP step, used by every trial and by the user's training code."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from scalertune._amp._autocast import CheckTurns, Clip, Forward
from scalertune._amp._check import RunCheck
from scalertune._amp._config import AmpConfig
from scalertune._amp._device import resolve_device
from scalertune._amp._engine import Engine
from scalertune._amp._guard import Guard
from scalertune._amp._readback import Readback
from scalertune._amp._scaler import DeviceStep
from scalertune._amp._scaling import LossScaler
from scalertune._amp._step_hooks import StepHooks
from scalertune._amp._watch import Watch
from scalertune._errors import UsageError


class AmpRuntime:
    """Owns the autocast context, the GradScaler and the unscale-then-clip step.

    One object per training run. The canonical AMP step it implements is::

        with amp.autocast():                 # forward + loss in the low-precision dtype
            loss = loss_fn(model(x), y)
        amp.backward(loss)                   # scaler.scale(loss).backward()
        amp.step(optimizer)                  # unscale_, clip_grad_norm_, scaler.step, update

    Why this order: backward runs on ``loss * scale`` so that small float16 gradients do not
    flush to zero. ``unscale_`` divides the gradients by the scale in place and records
    whether any is inf/NaN; clipping has to come after it, or ``max_norm`` would be compared
    with gradients that are still ``scale`` times too large. ``scaler.step`` skips the
    optimizer step when non-finite gradients were found (a *skipped step*), and
    ``scaler.update`` then multiplies the scale by ``backoff_factor``; after
    ``growth_interval`` finite steps in a row it multiplies it by ``growth_factor``.

    For bfloat16 and float32 the scaler is disabled: ``backward`` is a plain backward and
    ``step`` clips (if asked) and steps.

    The runtime adds no host sync to GradScaler's one per step (it must know whether to call
    ``optimizer.step``; a fused optimizer, which GradScaler hands the verdict on the device,
    makes none, and then asking whether :meth:`step` stepped reads it, one transfer, only
    when asked), and counts skipped steps from that decision
    (:class:`~scalertune._amp._decisions.ScalerDecisions`). What scales the loss is a
    :class:`~scalertune._amp._scaling.LossScaler` it owns (a bound engine's scaler, or its
    GradScaler), and its forward side a :class:`~scalertune._amp._autocast.Forward`. A
    ``guard`` and a ``watch`` read the device once every ``check_every`` steps. An in-run
    ``check`` (``scalertune.load`` and ``scalertune.attach`` build one from the result file)
    computes a step's loss again in float32 every ``check.policy.every`` steps, through
    :meth:`loss` (one more forward and one host read then), and acts when the precision fails
    (see :mod:`scalertune._amp._check`).

    Args:
        config: The :class:`~scalertune.AmpConfig` to train with.
        device: Where training runs: ``"auto"`` (the default: CUDA when this machine has it,
            else the CPU; ``None`` too), ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a
            ``torch.device``.
        guard: A :class:`~scalertune.Guard` that raises :class:`~scalertune.AmpGuardError`
            when the loss scale collapses; ``None`` (the default) for none. Only a config with
            a scaler (float16) is guarded.
        watch: A watch on the scaler's predicted course (:func:`scalertune.load` builds it
            from the YAML's prediction); ``None`` for none. float16 only.
        check: The in-run check (:func:`scalertune.load` builds it from the YAML's ``check``
            block); ``None`` for none. A float32 config runs none.
        model_check: Called with each model :meth:`prepare` sees (the check, against the
            YAML's fingerprint, that it is the model the search ran on); ``None`` for none.

    Raises:
        UsageError: ``device`` is unknown or names a CUDA device this machine does not
            have; ``config`` is no :class:`~scalertune.AmpConfig`, or ``guard``, ``watch`` or
            ``check`` none of the runtime's parts (``check=False`` is
            :func:`scalertune.load`'s).

    Example:
        >>> import torch, scalertune
        >>> model = torch.nn.Linear(4, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=4096.0), device="cpu")
        >>> x, y = torch.randn(8, 4), torch.randn(8, 1)
        >>> loss = amp.train_step(model, optimizer, torch.nn.functional.mse_loss, (x, y))
        >>> amp.steps, amp.skipped_steps
        (1, 0)
    """

    def __init__(
        self,
        config: AmpConfig,
        *,
        device: str | torch.device | None = "auto",
        guard: Guard | None = None,
        watch: Watch | None = None,
        check: RunCheck | None = None,
        model_check: Callable[[torch.nn.Module], None] | None = None,
    ) -> None:
        _refuse_wrong_types(config, guard=guard, watch=watch, check=check)
        self.config = config
        self._made_with = config  # before the in-run check changes anything
        self.guard = guard if config.uses_scaler else None
        self.watch = watch if config.uses_scaler else None
        #: The in-run check (``None``: the run does not check itself); float32 has nothing
        #: to check against.
        self.check = check if config.dtype != "float32" else None
        self.device = resolve_device(device)
        self._forward = Forward(config, self.device, model_check)
        reads = config.uses_scaler and (self.guard or self.watch or self.check)
        readback = Readback(self.guard, self.watch, self.check) if reads else None
        self._scaling = LossScaler(config, self.device, owner=self, readback=readback)
        self._clip = Clip(config.clip_norm) if config.clip_norm is not None else None
        self._turns = CheckTurns()  # when the in-run check takes the step's loss
        #: Called after each :meth:`backward` and first in :meth:`step`, while the gradients
        #: are backward's own: the float32 reference's gradient trace reads them there.
        self.hooks = StepHooks()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward context: autocast to the config's dtype (a no-op for float32).

        Returns:
            A context manager; run the forward and the loss inside it.

        Raises:
            UsageError: The config has float32 islands and :meth:`prepare` has not applied them
                to a model yet: without them the modules they name overflow float16 again.

        Example:
            >>> import torch, scalertune
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(dtype="bfloat16"), device="cpu")
            >>> model = amp.prepare(torch.nn.Linear(4, 1))
            >>> with amp.autocast():
            ...     out = model(torch.randn(2, 4))
            >>> out.dtype
            torch.bfloat16
        """
        return self._forward.autocast()

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Apply the config's float32 islands to ``model``, in place.

        Each module that ``fp32_modules`` names or matches (glob patterns over
        ``model.named_modules()`` names) runs with autocast disabled and its floating inputs
        cast to float32, so activations beyond float16's 65504 stay finite there; its output
        stays float32, and the next module under autocast casts it back down. An island is a
        pair of forward hooks (see :mod:`._islands`), so deepcopy (EMA, SWA), pickling and
        ``torch.compile`` carry it with its module. Calling it twice is harmless.

        An FSDP1-wrapped ``model`` gets ``ShardedGradScaler`` (see
        :class:`~scalertune._amp._scaler.RuntimeScaler`), before the first step.

        Args:
            model: The model to train; call before building the optimizer's first step.

        Returns:
            ``model`` itself.

        Raises:
            UsageError: A name or pattern of ``fp32_modules`` selects no module (the message
                names the closest names). A ``model`` that is not the one the result YAML
                was searched on gets a ``UserWarning``, once.

        Example:
            >>> import torch, scalertune
            >>> config = scalertune.AmpConfig(fp32_modules=("0",))
            >>> amp = scalertune.AmpRuntime(config, device="cpu")
            >>> model = amp.prepare(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
            >>> with amp.autocast():
            ...     out = model(torch.randn(2, 4))
            >>> out.dtype  # the island's output stays float32
            torch.float32
        """
        self._scaling.fit(model, self.config)  # FSDP1: ShardedGradScaler, before a step
        return self._forward.prepare(model)

    def bind(self, engine: Engine) -> None:
        """Train through ``engine``, which scales, clips and steps itself (DeepSpeed's).

        From here :meth:`backward` and :meth:`step` are the engine's, and the runtime counts
        and checks the steps it decides (see :mod:`scalertune._amp._engine`): its
        ``skipped_steps`` and its scale are the engine's own. Binding the bound engine again
        changes nothing. ``scalertune.attach`` binds a DeepSpeed Trainer's engine itself.

        Args:
            engine: What scales and steps: its ``backward(loss, gradients=...)``, ``step()``
                (whether the step was applied), ``scale()``, ``scaler_state()`` and
                ``load_scaler_state(state)``.

        Example:
            >>> import torch, scalertune
            >>> class Engine:  # scales nothing, applies every step
            ...     def backward(self, loss, *, gradients, **kwargs):
            ...         loss.backward()
            ...     def step(self):
            ...         return True
            ...     def scale(self):
            ...         return 1.0
            ...     def scaler_state(self):
            ...         return {"scale": 1.0}
            ...     def load_scaler_state(self, state):
            ...         pass
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(dtype="float32"), device="cpu")
            >>> amp.bind(Engine())
            >>> amp.engine is not None
            True
        """
        self._scaling.engine.bind(engine)

    @property
    def engine(self) -> Engine | None:
        """The engine bound with :meth:`bind`, if any."""
        return self._scaling.engine.engine

    @property
    def scaler(self) -> torch.amp.GradScaler:
        """The GradScaler (a :class:`~scalertune._amp._scaler.RuntimeScaler`: it reports each
        step to this runtime, whoever calls it; disabled for bfloat16 and float32)."""
        return self._scaling.scaler

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backward through the scaled loss (a plain backward when no scaler is active).

        Where an engine is bound (:meth:`bind`, a DeepSpeed run's), the engine's backward.

        Args:
            loss: The loss :meth:`loss` (or the forward under :meth:`autocast`) returned.
            **kwargs: Passed to ``Tensor.backward`` (``retain_graph``).

        Example:
            >>> import torch, scalertune
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=8.0), device="cpu")
            >>> w = torch.ones(2, requires_grad=True)
            >>> amp.backward(w.sum())
            >>> w.grad  # scaled by init_scale until step() unscales it
            tensor([8., 8.])
        """
        scaling = self._scaling  # on every step: the scaler's own call, no layer between
        if scaling.engine.active:
            scaling.engine.backward(loss, gradients=self.hooks.wants_gradients, **kwargs)
        else:
            scaling.scaler.scale(loss).backward(**kwargs)
        self.hooks.backward_done()

    def step(self, optimizer: torch.optim.Optimizer) -> bool | DeviceStep:
        """Unscale, clip (if configured), step the optimizer unless skipped, update the scale.

        Call after :meth:`backward`. Gradients are clipped on their true (unscaled) values,
        over all parameters the optimizer holds. A step GradScaler skipped (its gradients were
        inf/NaN) leaves the weights as they were and multiplies the scale by ``backoff_factor``.

        Args:
            optimizer: The optimizer over the model's parameters.

        Returns:
            Whether the optimizer really stepped: False for a skipped step. Step an LR
            scheduler only when it is true, as Accelerate does, or the schedule runs ahead of
            the optimizer. For an optimizer that applies GradScaler's flag inside its own kernel
            (fused Adam, AdamW, SGD) only the device knows: the result is then a
            :class:`~scalertune._amp._scaler.DeviceStep` whose ``bool()`` reads it (one
            transfer, taken only if asked).

        Example:
            >>> import torch, scalertune
            >>> model = torch.nn.Linear(2, 1)
            >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=4.0), device="cpu")
            >>> amp.backward(model(torch.full((1, 2), float("inf"))).sum())
            >>> amp.step(optimizer), amp.skipped_steps, amp.scaler.get_scale()
            (False, 1, 2.0)
        """
        self.hooks.grads_ready()
        return self._scaling.step(self, optimizer, self._clip)

    def loss(
        self,
        closure: Callable[[], Any],
        *,
        autocast: bool = True,
        recompute: Callable[[], Any] | None = None,
    ) -> Any:
        """Run ``closure`` (the forward and the loss, no backward) under :meth:`autocast`.

        This is how a loop hands the runtime its loss, so that the run can check itself. Every
        ``check.policy.every`` steps (and sooner after a streak of skipped steps) the in-run
        check runs ``closure`` once more, in float32, without gradients, at the same weights, on
        the same batch and with the same random numbers (dropout), and compares the two losses;
        when the precision fails it acts by the result file's policy (see
        :mod:`scalertune._amp._check`). ``closure`` is called once per micro-batch, as the loss
        is.

        Args:
            closure: Takes nothing and returns the loss, or a tuple or mapping holding it first
                or under ``"loss"`` (``(loss, logits)``, a model's output).
            autocast: ``False`` is for a framework whose model's forward runs under
                :meth:`autocast` itself (the trainers :func:`scalertune.attach` drives).
            recompute: What the check's extra passes call instead of ``closure`` (a
                LightningModule's ``training_step`` with its logging held back); ``None``:
                ``closure``.

        Returns:
            What ``closure`` returned.

        Raises:
            AmpCheckError: The in-run check found the precision failing and its policy is
                ``stop``.

        Example:
            >>> import torch, scalertune
            >>> model = torch.nn.Linear(4, 1)
            >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(dtype="bfloat16"), device="cpu")
            >>> model = amp.prepare(model)
            >>> x, y = torch.randn(8, 4), torch.randn(8, 1)
            >>> loss = amp.loss(lambda: torch.nn.functional.mse_loss(model(x), y))
            >>> amp.backward(loss)
            >>> amp.step(optimizer)
            True
        """
        check = self.check
        if check is not None and self._turns.take(check, self.steps, self.config.dtype):
            return check.run(self, closure, recompute or closure, autocast)
        if not autocast:  # a framework's model autocasts itself
            return closure()
        with self._forward.reused:
            return closure()

    def train_step(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        batch: tuple[Any, Any],
    ) -> torch.Tensor:
        """The whole canonical step on one ``(inputs, targets)`` batch.

        Zeroes the gradients, runs the forward and the loss through :meth:`loss` (so the run
        checks itself), then :meth:`backward` and :meth:`step`. Applies the float32 islands
        (:meth:`prepare`) to ``model`` on first use.

        Args:
            model: The model.
            optimizer: Its optimizer.
            loss_fn: ``loss_fn(model(inputs), targets)`` is the loss.
            batch: An ``(inputs, targets)`` pair.

        Returns:
            The loss, detached.

        Raises:
            AmpGuardError: The guard found the loss scale collapsed.
            AmpCheckError: The in-run check found the precision failing under policy ``stop``.

        Example:
            >>> import torch, scalertune
            >>> model = torch.nn.Linear(4, 1)
            >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(dtype="bfloat16"), device="cpu")
            >>> batch = torch.randn(8, 4), torch.randn(8, 1)
            >>> loss = amp.train_step(model, optimizer, torch.nn.functional.mse_loss, batch)
            >>> loss.requires_grad, amp.steps
            (False, 1)
        """
        self._forward.prepare(model)
        inputs, targets = batch
        optimizer.zero_grad(set_to_none=True)
        loss: torch.Tensor = self.loss(lambda: loss_fn(model(inputs), targets))
        self.backward(loss)
        self.step(optimizer)
        return loss.detach()

    @property
    def grad_norm(self) -> torch.Tensor | None:
        """The total norm of the last step's gradients, unscaled, before clipping (what
        ``clip_grad_norm_`` returns, and nanoGPT prints); ``None`` for a config that does not
        clip. A tensor on the device: reading it is a host sync."""
        return self._clip.last_norm if self._clip is not None else None

    @property
    def models(self) -> list[torch.nn.Module]:
        """The models :meth:`prepare` has seen (the in-run check's islands go on them)."""
        return self._forward.models

    def float32(self) -> contextlib.AbstractContextManager[None]:
        """A context with no autocast at all, whoever asks for one inside it.

        The in-run check runs its float32 forward in it.

        Returns:
            A context manager.

        Example:
            >>> import torch, scalertune
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(dtype="bfloat16"), device="cpu")
            >>> model = amp.prepare(torch.nn.Linear(4, 1))
            >>> with amp.float32(), amp.autocast():
            ...     model(torch.randn(2, 4)).dtype
            torch.float32
        """
        return self._forward.float32()

    def trying(self, config: AmpConfig) -> contextlib.AbstractContextManager[None]:
        """A context whose :meth:`autocast` is ``config``'s (its dtype, its float8 recipe).

        The in-run check's pass of a config it may move the run to; this config's again after.

        Args:
            config: The config whose forward to run inside.

        Returns:
            The context manager.

        Example:
            >>> import torch, scalertune
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(), device="cpu")
            >>> with amp.trying(scalertune.AmpConfig(dtype="bfloat16")), amp.autocast():
            ...     torch.ones(2, 2) @ torch.ones(2, 2)
            tensor([[2., 2.],
                    [2., 2.]], dtype=torch.bfloat16)
        """
        return self._forward.trying(config)

    def reconfigure(self, config: AmpConfig, *, scale: float | None = None) -> None:
        """Train under ``config`` from the next step on (the in-run check's action).

        Its float32 islands are added to the prepared models and its scaler knobs set in place;
        a float32 ``config`` disables the scaler, and every later step is taken; a config with
        a scaler after it enables the scaler again (a run rolled back to a checkpoint from
        before, :meth:`load_state_dict`). Only the islands, the dtype (to float32 and back)
        and the knobs may change.

        Args:
            config: The config to train with from now on.
            scale: The loss scale to set with the knobs; ``None`` keeps the current one.

        Raises:
            UsageError: ``config`` needs a loss scaler and this runtime was made without one
                (bfloat16, float32).

        Example:
            >>> import scalertune
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=4096.0), device="cpu")
            >>> amp.reconfigure(scalertune.AmpConfig(init_scale=4096.0, growth_interval=100),
            ...                 scale=256.0)
            >>> amp.scaler.get_scale(), amp.scaler.get_growth_interval()
            (256.0, 100)
        """
        self._scaling.configure(config, scale=scale)
        self.config = config
        self._forward.configure(config)

    def report(self) -> None:
        """Print what the in-run check saw and did.

        Its checks, its actions (each with its step and evidence), under the policy ``warn``
        its warnings (what it found, nothing changed), and the scaler's story beside
        the search's prediction; ``no in-run check`` for a runtime without one.

        Example:
            >>> import scalertune
            >>> scalertune.AmpRuntime(scalertune.AmpConfig(), device="cpu").report()
            no in-run check
        """
        print(self.check.report(self) if self.check is not None else "no in-run check")

    @property
    def steps(self) -> int:
        """The steps taken or skipped so far (a framework that steps without the scaler counts
        its own: ``amp.steps += 1``)."""
        return self._scaling.decisions.steps

    @steps.setter
    def steps(self, steps: int) -> None:
        self._scaling.decisions.steps = steps

    @property
    def last_step(self) -> bool | DeviceStep:
        """Whether the optimizer really stepped on the last step GradScaler decided (what
        :meth:`step` returned; for a framework that calls the scaler itself, the same)."""
        return self._scaling.decisions.last

    @property
    def scale(self) -> torch.Tensor:
        """The current loss scale as a device tensor (1.0 when no scaler is active; a bound
        engine's own scale); no sync."""
        return self._scaling.scale

    @property
    def skipped_steps(self) -> int:
        """Steps GradScaler skipped because gradients were inf/NaN (no device read, except
        for an optimizer that skips inside its own kernel: see
        :class:`~scalertune._amp._scaler.Skips`)."""
        return self._scaling.decisions.skips.total

    @property
    def skipped_on_device(self) -> torch.Tensor:
        """:attr:`skipped_steps` as a new 0-d int64 tensor on the device, read without a host
        sync (also where an optimizer skips inside its own kernel): the skips over a window
        are two of them subtracted, read with the window's end."""
        return self._scaling.decisions.skips.on_device(self.device)

    @property
    def readback(self) -> Readback | None:
        """What reads the device back every so many steps for the guard, the watch and the
        in-run check (``None``: nothing does); the check rebases the watch on it after it
        changed the run."""
        return self._scaling.decisions.readback

    def state_dict(self) -> dict[str, Any]:
        """The runtime's state for a training checkpoint.

        Returns:
            The scaler's state (``{}`` for a disabled scaler; the loss scaler's of a bound
            DeepSpeed engine), the step and skipped-step counts and, with an in-run check, the
            config it trains with now (islands added, knobs changed, float32) and the check's
            record, so that a resumed run keeps what the check did. Save it beside the model's
            and the optimizer's.

        Example:
            >>> import scalertune
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=1024.0), device="cpu")
            >>> state = amp.state_dict()
            >>> state["steps"], state["skipped"], state["scaler"]["scale"]
            (0, 0, 1024.0)
        """
        state = self._scaling.state_dict()
        if self.check is not None:
            state.update(
                config=self.config.to_dict(),
                check=self.check.state_dict(),
                made_with=self._made_with.to_dict(),
            )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; a resumed run keeps the in-run check's actions.

        Args:
            state: What :meth:`state_dict` returned.

        Example:
            >>> import scalertune
            >>> saved = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=1024.0), device="cpu")
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(), device="cpu")
            >>> amp.load_state_dict(saved.state_dict())
            >>> amp.scaler.get_scale()
            1024.0
        """
        if "config" in state and self.check is not None:
            saved = AmpConfig.from_dict(state["config"])
            made_with = state.get("made_with")
            if made_with is not None and AmpConfig.from_dict(made_with) != self._made_with:
                warnings.warn(  # another YAML attached than the run was: its config is kept
                    f"scalertune: the run this state is from was made with "
                    f"{AmpConfig.from_dict(made_with).describe()}, and this runtime with "
                    f"{self._made_with.describe()}: it goes on as the run it resumes, in "
                    f"{saved.describe()} (resume without the runtime's state to train the new "
                    "config)",
                    UserWarning,
                    stacklevel=2,
                )
            if saved != self.config:
                self.reconfigure(saved)
        self._scaling.load_state_dict(state)
        if "check" in state and self.check is not None:
            self.check.load_state_dict(state["check"])

    def load_scaler_state(self, state: Mapping[str, Any]) -> None:
        """Start the scaler from ``state``, a checkpoint's or a replay's.

        A search's branch starts where the replay puts a config's scaler at its first step.
        GradScaler's keys go over its own state; with a bound engine (:meth:`bind`), the
        engine's scaler takes them (kept for the engine until it is bound).

        Args:
            state: The scaler's state, or part of it, as its ``state_dict()`` keys it
                (GradScaler's ``scale``, ``_growth_tracker``, ...).

        Example:
            >>> import scalertune
            >>> amp = scalertune.AmpRuntime(scalertune.AmpConfig(init_scale=1024.0), device="cpu")
            >>> amp.load_scaler_state({"scale": 64.0})
            >>> amp.scaler.get_scale()
            64.0
        """
        self._scaling.load(state)


def _refuse_wrong_types(config: Any, *, guard: Any, watch: Any, check: Any) -> None:
    """Refuse, in one line, what is not the runtime's own parts (a YAML's path where the
    config goes, ``check=False`` where :func:`scalertune.load` takes it), before a step
    would fail on it with a traceback."""
    if not isinstance(config, AmpConfig):
        raise UsageError(
            f"AmpRuntime takes an AmpConfig, not {type(config).__name__}: for a result YAML "
            "use scalertune.load(path)"
        )
    if guard is not None and not isinstance(guard, Guard):
        raise UsageError(
            f"guard must be a scalertune.Guard or None, not {type(guard).__name__}: "
            "scalertune.load(path, guard=False) leaves the YAML's guard out"
        )
    if watch is not None and not isinstance(watch, Watch):
        raise UsageError(
            f"watch must be a watch scalertune.load builds, or None, not {type(watch).__name__}"
        )
    if check is not None and not all(hasattr(check, name) for name in ("due", "run", "policy")):
        raise UsageError(
            f"check must be an in-run check scalertune.load builds, or None, not "
            f"{type(check).__name__}: scalertune.load(path, check=...) takes False, 'act', "
            "'warn', 'stop' or a CheckPolicy"
        )
