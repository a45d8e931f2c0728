"""export: the recommended config as the objects a framework takes, and the code that builds them.

Each framework exposes a different subset of the knobs. :func:`export` returns an
:class:`Export`: :meth:`Export.build` makes the framework's own objects (a Lightning precision
plugin, Accelerate's kwargs handler, DeepSpeed's config dict, ``TrainingArguments`` fields),
and :attr:`Export.code` is the code (or, for DeepSpeed, the JSON) that builds the very same
objects, since both come from one description. What a framework cannot express is listed in
:attr:`Export.not_expressible` and the nearest setting is used (``strict=True`` refuses
instead); where a framework's scaler behaves differently from GradScaler with the same
numbers, :attr:`Export.differences` says how and by how much.

- torch: everything: GradScaler, autocast, ``clip_grad_norm_`` after ``unscale_``.
- lightning: ``MixedPrecision(..., scaler=GradScaler(...))`` and ``gradient_clip_val``.
- accelerate: ``mixed_precision`` and ``GradScalerKwargs``; clipping is a call in the loop.
- transformers: ``TrainingArguments`` has only ``fp16``/``bf16``/``max_grad_norm``; the
  loss scaler's knobs go into the Trainer with ``scalertune.attach(trainer, ...)``.
- deepspeed: its ``fp16`` block grows by 2 and backs off by 0.5, takes the initial scale as a
  power of two, never goes below a minimum scale of 1, and grows one step later than GradScaler.

A float8 config (torchao's float8 training, :mod:`._torchao`) has no loss scaler: torch,
torchao, Lightning and Transformers get torchao's ``Float8LinearConfig``, a filter of the
layers it converts and the precision around float8; Accelerate its own ``fp8`` with
``AORecipeKwargs``; torchtitan its float8 converter's config (:mod:`._torchtitan`). DeepSpeed
has no float8, torchao and torchtitan take nothing else.

Float32 islands are applied by :meth:`Export.prepare` (or the line of code that does the same)
in every framework that runs the model under autocast: all but DeepSpeed, whose fp16 and bf16
modes cast the model itself to half precision. For a Hugging Face Trainer, a Lightning Trainer
and an Accelerate Accelerator the code also shows ``scalertune.attach``, which puts the whole
config, the guard and the watch into the trainer in one call (and trains float16 on a CPU too).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from scalertune import _limits
from scalertune._amp._config import AmpConfig, DeepSpeedFp16Config
from scalertune._errors import UsageError
from scalertune._export import (
    _accelerate,
    _code,
    _deepspeed,
    _lightning,
    _torch,
    _torchao,
    _torchtitan,
    _transformers,
)
from scalertune._export._code import Call, Device, Parts, build, program

if TYPE_CHECKING:
    import torch

    from scalertune._review._result import SearchResult

FRAMEWORKS = (
    "torch",
    "lightning",
    "accelerate",
    "transformers",
    "deepspeed",
    "torchao",
    "torchtitan",
)


@dataclasses.dataclass(frozen=True)
class Export:
    """A config for one framework: the objects it takes, the code that builds them, and the gaps.

    :func:`export` returns one. ``not_expressible`` lists what the framework cannot say of
    the config (the nearest setting is used instead), ``differences`` what it does otherwise
    than GradScaler; the code carries both as comments.

    Example:
        >>> import scalertune
        >>> config = scalertune.AmpConfig(init_scale=4096.0, clip_norm=1.0)
        >>> ds = scalertune.export(config, "deepspeed")
        >>> ds.build()["fp16"]["initial_scale_power"], ds.build()["gradient_clipping"]
        (12, 1.0)
        >>> ds.not_expressible
        ()
        >>> trainer_kwargs = scalertune.export(config, "lightning", device="cpu").build()
        >>> sorted(trainer_kwargs)  # doctest: +SKIP
        ['gradient_clip_algorithm', 'gradient_clip_val', 'plugins']
    """

    framework: str
    config: AmpConfig
    #: The device type the objects are built for (``"cuda"``, ``"cpu"``); "auto" resolved.
    device: str
    not_expressible: tuple[str, ...]
    differences: tuple[str, ...]
    _spec: Mapping[str, Any] = dataclasses.field(repr=False)
    _name: str | None = dataclasses.field(repr=False)
    _device_line: str | None = dataclasses.field(repr=False)
    _usage: tuple[str, ...] = dataclasses.field(repr=False)
    #: Calls that change the model (a float8 conversion), run by :meth:`prepare`.
    _model_calls: tuple[Call, ...] = dataclasses.field(default=(), repr=False)
    #: Whether the float32 islands need :class:`AmpRuntime`'s hooks: under autocast.
    _islands: bool = dataclasses.field(default=False, repr=False)

    def build(self) -> dict[str, Any]:
        """The framework's own objects, keyed as its constructor or config takes them.

        Importing the framework is left to this call, so the code text needs none of them
        installed.

        Returns:
            For torch, ``scaler`` (a GradScaler), ``autocast`` (``torch.autocast`` keyword
            arguments) and ``max_norm``; lightning: ``Trainer`` keyword arguments (the precision
            plugin with its GradScaler, the clipping); accelerate: ``Accelerator`` keyword
            arguments (the ``GradScalerKwargs`` handler); transformers: ``TrainingArguments``
            fields; deepspeed: the config dict (``json.dump`` it as ``ds_config.json``);
            torchao: ``config`` (its ``Float8LinearConfig``), ``module_filter_fn`` and, for
            bfloat16 around float8, ``autocast``; torchtitan: ``float8_converter`` (its
            converter's config) and ``training`` fields.

        Raises:
            UsageError: The framework is not installed.

        Example:
            >>> import scalertune
            >>> config = scalertune.AmpConfig(init_scale=4096.0, clip_norm=1.0)
            >>> parts = scalertune.export(config, "torch", device="cpu").build()
            >>> parts["scaler"].get_scale(), parts["max_norm"]
            (4096.0, 1.0)
        """
        self._import_torchao()
        return {key: build(value) for key, value in self._spec.items()}

    @property
    def clip_norm(self) -> float | None:
        """The clipping norm: where a framework clips in the loop, pass this."""
        return self.config.clip_norm

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Make ``model`` train as the config says, in place: its float8 layers and islands.

        A float8 config's Linear layers are converted first (torchao's
        ``convert_to_float8_training``, the framework's own way where it has one: Accelerate
        converts in ``accelerator.prepare``); then the float32 islands get their hooks where
        the model runs under autocast. A no-op for a config with neither.

        Args:
            model: The model to train.

        Returns:
            ``model`` itself.

        Raises:
            UsageError: An island's name or pattern selects no module of ``model``, or a
                float8 config without torchao installed.

        Example:
            >>> import torch, scalertune
            >>> config = scalertune.AmpConfig(fp32_modules=("0",))
            >>> model = scalertune.export(config, "torch", device="cpu").prepare(
            ...     torch.nn.Sequential(torch.nn.Linear(2, 2)))
            >>> with torch.autocast("cpu", dtype=torch.bfloat16):
            ...     model(torch.randn(1, 2)).dtype
            torch.float32
        """
        from scalertune._amp._runtime import AmpRuntime

        self._import_torchao()
        for call in self._model_calls:
            build(call, model)
        if not self._islands:
            return model
        return AmpRuntime(
            AmpConfig(fp32_modules=self.config.fp32_modules), device=self.device
        ).prepare(model)

    @property
    def code(self) -> str:
        """Code that builds :meth:`build`'s objects (JSON for DeepSpeed).

        Comments mark what is not expressible or behaves differently, and where the objects go.
        """
        if self.framework == "deepspeed":
            return json.dumps(self.build(), indent=2) + "\n"
        after = []
        if self._islands:
            after.append(
                f"scalertune.AmpRuntime(scalertune.AmpConfig(fp32_modules="
                f"{list(self.config.fp32_modules)!r}), device=device).prepare(model)"
                "  # float32 islands"
            )
        return program(
            self._head(),
            self._spec,
            name=self._name,
            device_line=self._device_line,
            model_calls=self._model_calls,
            after=after,
            usage=self._usage,
        )

    def comments(self) -> list[str]:
        """What :attr:`code` says besides the code, for JSON, which has no comments.

        The title, what is not expressible, what differs, and where the objects go: print
        these apart from DeepSpeed's JSON.

        Returns:
            The comment lines, each starting with ``#``.

        Example:
            >>> import scalertune
            >>> scalertune.export(scalertune.AmpConfig(), "torch", device="cpu").comments()[0]
            '# scalertune export for torch: float16 scale=6.554e+04 growth=2 backoff=0.5 ...'
        """
        return [*self._head(), *(line for line in self._usage if line)]

    def _head(self) -> list[str]:
        return [
            f"# scalertune export for {self.framework}: {self.config.describe()}",
            *(f"# NOT EXPRESSIBLE: {line}" for line in self.not_expressible),
            *(f"# DIFFERS: {line}" for line in self.differences),
        ]

    def __str__(self) -> str:
        return self.code

    def _import_torchao(self) -> None:
        """torchao, imported once through its fence (quietly, its release checked), before
        any of a float8 config's objects is built."""
        if self.config.float8:
            from scalertune._amp._torchao_private import torchao_float8

            torchao_float8()


def export(
    source: AmpConfig | str | os.PathLike[str] | SearchResult,
    framework: str,
    *,
    device: str = "auto",
    strict: bool = False,
    micro_batch_size: int | None = None,
    best_amp: bool = False,
) -> Export:
    """The config in ``source`` as the objects (and the code) ``framework`` takes.

    Args:
        source: An :class:`AmpConfig`, a :class:`SearchResult`, or the path of a YAML file
            that ``scalertune search`` wrote; the last two also carry the smallest loss scale
            the search's runs reached, which DeepSpeed's minimum scale is checked against.
        framework: One of :data:`FRAMEWORKS`: ``"torch"``, ``"lightning"``,
            ``"accelerate"``, ``"transformers"``, ``"deepspeed"``, and for a float8 config
            ``"torchao"`` and ``"torchtitan"``.
        device: What the training runs on: ``"auto"`` (CUDA when this machine has it),
            ``"cuda"``, ``"cpu"``.
        strict: ``True`` raises where the framework cannot express a value; ``False`` (the
            default) uses the nearest setting and says so in ``not_expressible``.
        micro_batch_size: Completes DeepSpeed's config, which refuses one without a batch
            size (``"deepspeed"`` only).
        best_amp: ``True`` exports the best AMP config that held (``evidence.best_amp``)
            instead of the answer: where a search on a CPU answered float32, the config for a
            GPU. A YAML or a :class:`SearchResult` only.

    Returns:
        The :class:`Export`: :meth:`Export.build` makes the objects, :attr:`Export.code`
        writes the code.

    Raises:
        UsageError: An unknown ``framework``, one that cannot train the config (float8 in
            DeepSpeed, another dtype in torchao or torchtitan), ``micro_batch_size`` for
            another framework than DeepSpeed, ``best_amp`` with a bare config, a ``source`` of
            another type or a YAML that is missing or malformed, or with ``strict=True`` a
            value the framework cannot express (the command line exits with status 2).
        ParameterError: ``micro_batch_size`` out of range (a ``UsageError`` too).

    Example:
        >>> import scalertune
        >>> ds = scalertune.export(scalertune.AmpConfig(init_scale=4096.0), "deepspeed",
        ...                        micro_batch_size=8)
        >>> ds.build()["train_micro_batch_size_per_gpu"]
        8
        >>> print(scalertune.export(scalertune.AmpConfig(dtype="bfloat16"), "torch",
        ...                         device="cpu").code)  # doctest: +ELLIPSIS
        # scalertune export for torch: bfloat16, no clip
        ...
    """
    if framework not in FRAMEWORKS:
        raise UsageError(f"unknown framework {framework!r}: use one of {', '.join(FRAMEWORKS)}")
    if micro_batch_size is not None and framework != "deepspeed":
        raise UsageError("micro_batch_size is for DeepSpeed's config (framework 'deepspeed')")
    _limits.check(_limits.EXPORT, micro_batch_size=micro_batch_size)
    config, evidence = _read_source(source, best_amp)
    _check_fits(config, framework, None if best_amp else evidence)
    where = _code.device(device)
    if framework == "deepspeed":  # the one format that needs the evidence and a batch size
        parts = _deepspeed.deepspeed(config, _deepspeed.lowest_scale(evidence), micro_batch_size)
    else:
        parts = _writer(framework, config)(config, where)
    islands = _islands_hooked(framework, config)
    if framework in _ATTACHABLE:
        parts.usage += _attach_usage(framework, config, _attach_argument(source, config, best_amp))
    if framework == "deepspeed" and config.uses_scaler:
        horizon = _deepspeed.horizon(evidence, config)
        searched = isinstance(config, DeepSpeedFp16Config)  # a prediction, not a difference
        (parts.usage if searched else parts.differ).extend(
            f"# {line}" if searched else line for line in horizon
        )
    if framework == "deepspeed":
        _deepspeed.users_config(parts, evidence)
    result = Export(
        framework=framework,
        config=config,
        device=where.value,
        not_expressible=tuple(parts.lost),
        differences=tuple(parts.differ),
        _spec=parts.spec,
        _name=parts.name,
        _device_line=where.line if parts.uses_device or islands else None,
        _usage=tuple(parts.usage),
        _model_calls=tuple(parts.model_calls),
        _islands=islands,
    )
    if strict and result.not_expressible:
        raise UsageError(
            f"{framework} cannot express: {'; '.join(result.not_expressible)} "
            "(drop --strict to get the nearest setting)"
        )
    return result


def _check_fits(config: AmpConfig, framework: str, evidence: Any = None) -> None:
    """Refuse a config ``framework`` has no way to train: DeepSpeed's searched fp16 block
    elsewhere, float8 in DeepSpeed, another dtype than float8 in torchao or torchtitan (and
    say so where the answer's ``evidence`` holds a float8 best AMP config)."""
    if isinstance(config, DeepSpeedFp16Config) and framework != "deepspeed":
        raise UsageError(
            f"this config is DeepSpeed's fp16 block, searched in DeepSpeed's engine under its "
            f"own loss scaler, which {framework} does not have: export it --to deepspeed"
        )
    if config.float8 and framework == "deepspeed":
        raise UsageError(
            "DeepSpeed's fp16 and bf16 engines have no float8: export a float8 config --to "
            "torchao, torch, accelerate, lightning, transformers or torchtitan"
        )
    if framework in _FLOAT8_ONLY and not config.float8:
        if _float8_best_amp(evidence):
            raise UsageError(
                f"{framework} is exported for a float8 config, and the answer is "
                f"{config.dtype}: its best AMP config (evidence.best_amp) is float8, export "
                "that one with --best-amp (best_amp=True)"
            )
        raise UsageError(
            f"{framework} is exported for a float8 config, and this one is {config.dtype}: "
            "export it --to torch, lightning, accelerate, transformers or deepspeed"
        )


def _float8_best_amp(evidence: Any) -> bool:
    """Whether a result's ``evidence`` holds a best AMP config in float8."""
    block = evidence.get("best_amp") if isinstance(evidence, Mapping) else None
    config = block.get("config") if isinstance(block, Mapping) else None
    return isinstance(config, Mapping) and config.get("dtype") == "float8"


def _writer(framework: str, config: AmpConfig) -> Callable[[AmpConfig, Device], Parts]:
    """The writer of ``framework`` for ``config``: its float8 one for a float8 config."""
    return (_FLOAT8_WRITERS if config.float8 else _WRITERS)[framework]


def _islands_hooked(framework: str, config: AmpConfig) -> bool:
    """Whether the islands need :class:`AmpRuntime`'s hooks in ``framework``: where the model
    runs under autocast. Under float8 in float32 the filter alone keeps them out of float8;
    DeepSpeed and torchtitan cast the model itself."""
    if not config.fp32_modules or framework in ("deepspeed", "torchtitan"):
        return False
    return config.autocast_dtype != "float32" or not config.float8


def _read_source(source: Any, best_amp: bool) -> tuple[AmpConfig, Any]:
    """The config to export, and the evidence it came with (``None`` for a bare config);
    with ``best_amp``, the best AMP config's, and its own evidence block."""
    from scalertune._amp._schema import best_amp_block, check_policy, config_in, read_result
    from scalertune._review._result import SearchResult

    if isinstance(source, AmpConfig):
        if best_amp:
            raise UsageError("best_amp reads a search's result: give its YAML or SearchResult")
        return source, None
    if isinstance(source, (str, os.PathLike)):
        data = read_result(os.fspath(source))
        check_policy(data, os.fspath(source))  # what the printed attach line would load
    elif isinstance(source, SearchResult):
        data = source.to_dict()
    else:
        raise UsageError(
            f"cannot export a {type(source).__name__}: give an AmpConfig, a "
            "SearchResult or the path of a result YAML"
        )
    evidence = data.get("evidence")
    where = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "this search"
    if not best_amp:
        return config_in(data, where), evidence
    block = best_amp_block(data, where)
    said = {
        key: evidence.get(key)
        for key in ("deepspeed_prediction", "prediction", "deepspeed")
        if isinstance(evidence, Mapping)
    }
    return config_in(block, where), {**block, **said}


#: The frameworks whose trainer ``scalertune.attach`` takes, and what it is called there.
_ATTACHABLE = {
    "lightning": ("trainer", "before trainer.fit(...)"),
    "accelerate": ("accelerator", "before accelerator.prepare(...)"),
    "transformers": ("trainer", "before trainer.train()"),
}


def _attach_argument(source: Any, config: AmpConfig, best_amp: bool) -> str:
    """How the attach line names the config: the YAML's path, or the config itself."""
    if isinstance(source, (str, os.PathLike)):
        return repr(os.fspath(source)) + (", best_amp=True" if best_amp else "")
    return f"scalertune.AmpConfig.from_dict({config.to_dict()!r})"  # its own fields only


def _attach_usage(framework: str, config: AmpConfig, argument: str) -> list[str]:
    name, when = _ATTACHABLE[framework]
    parts = [
        f"{config.dtype} autocast"
        + (" with a GradScaler of exactly these knobs" if config.uses_scaler else "")
    ]
    if config.dtype == "float32":
        parts = ["float32"]
    if config.float8:
        parts = [f"float8 (torchao) in {config.float8_around}"]
    if framework != "accelerate":  # an Accelerate loop clips with its own call
        clip = config.clip_norm is not None
        parts.append("the clipping" if clip else "no clipping (the trainer's own turned off)")
    if config.fp32_modules:
        parts.append("the float32 islands")
    if config.uses_scaler:
        parts.append("the guard and the watch")
    what = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    line = f"#     amp = scalertune.attach({name}, {argument})  # {when}"
    if framework == "transformers":
        return [
            f"# TrainingArguments has no loss-scaler settings: scalertune.attach puts {what}",
            "# into the Trainer, whatever its fp16/bf16:",
            line,
            "#     trainer.train()"
            + ("; print(amp.skipped_steps, amp.scaler.get_scale())" if config.uses_scaler else ""),
        ]
    said = [f"# or, instead: scalertune.attach puts {what} into the {name}", line]
    if framework == "accelerate":  # the loss of a loop of the user's own is theirs to hand over
        said.append(
            "#     loss = amp.loss(lambda: loss_fn(model(inputs), targets))  # the in-run check"
        )
    return said


#: The writers of the frameworks that run under autocast on a device (DeepSpeed's JSON is
#: written by :func:`._deepspeed.deepspeed`, from the search's evidence and the batch size).
_WRITERS: dict[str, Callable[[AmpConfig, Device], Parts]] = {
    "torch": _torch.loop,
    "lightning": _lightning.lightning,
    "accelerate": _accelerate.accelerate,
    "transformers": _transformers.transformers,
}


#: The writers of a float8 config: torchao's conversion, and the framework's settings of the
#: precision around it.
_FLOAT8_WRITERS: dict[str, Callable[[AmpConfig, Device], Parts]] = {
    "torch": _torch.torch_float8,
    "torchao": _torchao.torchao,
    "lightning": _lightning.lightning_float8,
    "accelerate": _torchao.accelerate,
    "transformers": _transformers.transformers_float8,
    "torchtitan": _torchtitan.torchtitan,
}

#: The frameworks exported for a float8 config only.
_FLOAT8_ONLY = ("torchao", "torchtitan")
