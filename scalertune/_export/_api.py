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
import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from scalertune import _limits
from scalertune._amp._config import FP16_OTHER_KEYS, AmpConfig, DeepSpeedFp16Config
from scalertune._errors import UsageError
from scalertune._export import _code, _torchao, _torchtitan
from scalertune._export._code import Call, Device, Expr, Name, Parts, build, program
from scalertune._replay._deepspeed_block import DEEPSPEED_MIN_LOSS_SCALE, deepspeed_fp16_block

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
    _check_fits(config, framework)
    where = _code.device(device)
    if framework == "deepspeed":  # the one format that needs the evidence and a batch size
        parts = _deepspeed(config, _lowest_scale(evidence), micro_batch_size)
    else:
        parts = _writer(framework, config)(config, where)
    islands = _islands_hooked(framework, config)
    if framework in _ATTACHABLE:
        parts.usage += _attach_usage(framework, config, _attach_argument(source, config, best_amp))
    if framework == "deepspeed" and config.uses_scaler:
        horizon = _deepspeed_horizon(evidence, config)
        searched = isinstance(config, DeepSpeedFp16Config)  # a prediction, not a difference
        (parts.usage if searched else parts.differ).extend(
            f"# {line}" if searched else line for line in horizon
        )
    if framework == "deepspeed":
        _users_config(parts, evidence)
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


def _check_fits(config: AmpConfig, framework: str) -> None:
    """Refuse a config ``framework`` has no way to train: DeepSpeed's searched fp16 block
    elsewhere, float8 in DeepSpeed, another dtype than float8 in torchao or torchtitan."""
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
        raise UsageError(
            f"{framework} is exported for a float8 config, and this one is {config.dtype}: "
            "export it --to torch, lightning, accelerate, transformers or deepspeed"
        )


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
    from scalertune._amp._schema import best_amp_block, read_result
    from scalertune._review._result import SearchResult

    if isinstance(source, AmpConfig):
        if best_amp:
            raise UsageError("best_amp reads a search's result: give its YAML or SearchResult")
        return source, None
    if isinstance(source, (str, os.PathLike)):
        data = read_result(os.fspath(source))
    elif isinstance(source, SearchResult):
        data = source.to_dict()
    else:
        raise UsageError(
            f"cannot export a {type(source).__name__}: give an AmpConfig, a "
            "SearchResult or the path of a result YAML"
        )
    evidence = data.get("evidence")
    if not best_amp:
        return AmpConfig.from_dict(data["config"]), evidence
    block = best_amp_block(
        data, os.fspath(source) if isinstance(source, (str, os.PathLike)) else "this search"
    )
    said = {
        key: evidence.get(key)
        for key in ("deepspeed_prediction", "prediction", "deepspeed")
        if isinstance(evidence, Mapping)
    }
    return AmpConfig.from_dict(block["config"]), {**block, **said}


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
    return "scalertune." + repr(config)


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
        parts.append("the clipping")
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
            + ("" if config.float8 else "; print(amp.skipped_steps, amp.scaler.get_scale())"),
        ]
    return [f"# or, instead: scalertune.attach puts {what} into the {name}", line]


def _deepspeed_horizon(evidence: Any, config: AmpConfig) -> list[str]:
    """What DeepSpeed's scaler would do over the search's horizon, replayed from the float32
    reference's gradient trace (the search writes it for a float16 config: for a block it
    searched in DeepSpeed, its own prediction)."""
    key = "prediction" if isinstance(config, DeepSpeedFp16Config) else "deepspeed_prediction"
    said = evidence.get(key) if isinstance(evidence, Mapping) else None
    if not isinstance(said, Mapping) or "says" not in said:
        return []
    return [
        f"over the horizon ({said.get('horizon')} steps), replayed from the search's "
        f"float32 gradient trace, DeepSpeed's scaler {said['says']}"
    ]


def _users_config(parts: Parts, evidence: Any) -> None:
    """The DeepSpeed config the searched factory (or Trainer) trained with, under the
    answer's ``fp16``, ``bf16`` and ``gradient_clipping``: the whole ``ds_config.json``."""
    facts = evidence.get("deepspeed") if isinstance(evidence, Mapping) else None
    base = facts.get("config") if isinstance(facts, Mapping) else None
    if not isinstance(base, Mapping):
        return
    kept = {k: v for k, v in base.items() if k not in ("fp16", "bf16", "bfloat16")}
    parts.spec = {**kept, **parts.spec}
    searched, answer = base.get("fp16"), parts.spec.get("fp16")
    if isinstance(searched, Mapping) and isinstance(answer, dict) and answer.get("enabled"):
        # what the block held beside its scaler (auto_cast casts the inputs) trains as searched
        others = {k: searched[k] for k in FP16_OTHER_KEYS if k in searched}
        parts.spec["fp16"] = {**answer, **others}
    parts.usage = [
        line for line in parts.usage if "refuses a config without a batch size" not in line
    ]
    parts.usage.insert(
        0,
        "# the searched DeepSpeed config, with the answer's fp16, bf16 and gradient_clipping",
    )


def _lowest_scale(evidence: Any) -> float | None:
    """The smallest loss scale the recommended config reached on any seed of the search."""
    if not isinstance(evidence, Mapping):
        return None
    runs = [evidence, *(evidence.get("confirmation") or {}).values()]
    scales = [
        r["min_scale"]
        for r in runs
        if isinstance(r, Mapping) and isinstance(r.get("min_scale"), (int, float))
    ]
    return min(scales) if scales else None


def _knobs(c: AmpConfig) -> dict[str, Any]:
    return {
        "init_scale": c.init_scale,
        "growth_factor": c.growth_factor,
        "backoff_factor": c.backoff_factor,
        "growth_interval": c.growth_interval,
    }


def _grad_scaler(c: AmpConfig, device: Device) -> Call:
    if not c.uses_scaler:
        return Call("torch.amp:GradScaler", (device,), {"enabled": False})
    return Call("torch.amp:GradScaler", (device,), _knobs(c))


def _torch(c: AmpConfig, device: Device) -> Parts:
    autocast: dict[str, Any] = {"device_type": device}
    if c.dtype == "float32":
        autocast["enabled"] = False
    else:
        autocast["dtype"] = Name(f"torch:{c.dtype}")
    usage = [
        "",
        "# for inputs, targets in loader:",
        "#     optimizer.zero_grad(set_to_none=True)",
        "#     with torch.autocast(**autocast):",
        "#         loss = loss_fn(model(inputs), targets)",
        "#     scaler.scale(loss).backward()",
    ]
    if c.clip_norm is not None:
        usage += [
            "#     scaler.unscale_(optimizer)  # clip the true gradients, not scaled ones",
            "#     torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
        ]
    usage += [
        "#     scaler.step(optimizer)  # skipped when the gradients are inf/NaN",
        "#     scaler.update()",
        "# scalertune.load(YAML) does the same step and adds the guard the search recommends",
    ]
    return Parts(
        {"scaler": _grad_scaler(c, device), "autocast": autocast, "max_norm": c.clip_norm},
        usage=usage,
    )


def _lightning(c: AmpConfig, device: Device) -> Parts:
    plugin = "lightning.pytorch.plugins.precision:MixedPrecision"
    spec: dict[str, Any]
    if c.dtype == "float16":
        spec = {
            "plugins": [Call(plugin, ("16-mixed", device), {"scaler": _grad_scaler(c, device)})]
        }
    elif c.dtype == "bfloat16":
        spec = {"plugins": [Call(plugin, ("bf16-mixed", device))]}
    else:
        spec = {"precision": "32-true"}
    # None is Lightning's own "no clipping"; written out so that it is not left to a default.
    spec["gradient_clip_val"] = c.clip_norm
    spec["gradient_clip_algorithm"] = "norm"
    usage = ["# trainer = lightning.pytorch.Trainer(**trainer_kwargs, ...your own arguments)"]
    if c.dtype != "float32":
        usage.append(
            "# (the plugin's device is the Trainer's accelerator: one kind of device for both)"
        )
    return Parts(spec, name="trainer_kwargs", usage=usage, uses_device=c.dtype != "float32")


def _accelerate(c: AmpConfig, device: Device) -> Parts:
    spec: dict[str, Any] = {
        "mixed_precision": {"float16": "fp16", "bfloat16": "bf16", "float32": "no"}[c.dtype]
    }
    if c.uses_scaler:
        spec["kwargs_handlers"] = [Call("accelerate.utils:GradScalerKwargs", (), _knobs(c))]
    if device.value == "cpu" and not device.auto:
        spec["cpu"] = True  # Accelerate would take the GPU if there is one
    parts = Parts(spec, name="accelerator_kwargs", uses_device=bool(c.fp32_modules))
    parts.usage = ["# accelerator = accelerate.Accelerator(**accelerator_kwargs)"]
    if c.clip_norm is not None:
        parts.usage += [
            "# in the loop, between accelerator.backward(loss) and optimizer.step():",
            f"#     accelerator.clip_grad_norm_(model.parameters(), {c.clip_norm!r})",
        ]
    parts.differ += _float32_on_a_cpu(c, device, "mixed_precision='fp16'")
    return parts


def _float32_on_a_cpu(c: AmpConfig, device: Device, setting: str) -> list[str]:
    """The one note that Accelerate's float16 (an Accelerator's, a Hugging Face Trainer's)
    trains in float32 on a CPU, where ``attach`` trains float16; none elsewhere."""
    if not (c.uses_scaler and device.value == "cpu"):
        return []
    return [
        f"Accelerate makes a GradScaler and autocasts to float16 only on GPUs: on a CPU, "
        f"{setting} trains in float32 (scalertune.attach trains float16 there too)"
    ]


def _transformers(c: AmpConfig, device: Device) -> Parts:
    parts = Parts(
        {
            "fp16": c.dtype == "float16",
            "bf16": c.dtype == "bfloat16",
            # 0 turns off the Trainer's own clipping at 1.0
            "max_grad_norm": c.clip_norm if c.clip_norm is not None else 0.0,
            "use_cpu": Expr('device == "cpu"', device.value == "cpu"),
        },
        name="training_arguments",
    )
    parts.differ += _float32_on_a_cpu(c, device, "the Trainer's fp16=True")
    parts.usage = [
        "# args = transformers.TrainingArguments(output_dir=..., **training_arguments)",
        "# trainer = transformers.Trainer(model=model, args=args, ...)",
    ]
    return parts


def _deepspeed(c: AmpConfig, lowest: float | None, batch: int | None) -> Parts:
    spec: dict[str, Any] = {}
    if batch is not None:
        spec["train_micro_batch_size_per_gpu"] = batch
    parts = Parts(spec, uses_device=False)
    if isinstance(c, DeepSpeedFp16Config):  # searched in DeepSpeed: its block as it trained
        spec["fp16"] = c.fp16_block()
    else:
        spec["fp16"] = _deepspeed_fp16(c, lowest, parts) if c.uses_scaler else {"enabled": False}
    spec["bf16"] = {"enabled": c.dtype == "bfloat16"}
    # Always written: DeepSpeed clips at 1.0 when the key is absent; 0 turns clipping off.
    spec["gradient_clipping"] = c.clip_norm if c.clip_norm is not None else 0.0
    if c.fp32_modules:
        parts.lost.append(
            f"fp32_modules {list(c.fp32_modules)}: DeepSpeed's fp16 and bf16 modes "
            "cast the whole model to half precision; keep those modules' "
            "computation in float32 in your model code"
        )
    if c.dtype != "float32" and not isinstance(c, DeepSpeedFp16Config):
        parts.differ.append(
            f"DeepSpeed casts the model's weights and activations to {c.dtype} "
            "instead of autocasting: ops autocast runs in float32 (softmax, "
            "layer_norm, losses) run in half precision unless the model upcasts"
        )
    parts.usage = [
        "# save it as ds_config.json: deepspeed.initialize(model=model, "
        'model_parameters=model.parameters(), config="ds_config.json")'
    ]
    if batch is None:
        parts.usage.append(
            "# DeepSpeed refuses a config without a batch size: add your "
            "train_micro_batch_size_per_gpu (or export with --micro-batch-size)"
        )
    return parts


def _deepspeed_fp16(c: AmpConfig, lowest: float | None, parts: Parts) -> dict[str, Any]:
    """DeepSpeed's dynamic loss scaler, as close to GradScaler with ``c``'s knobs as it gets.

    DeepSpeed (``deepspeed/runtime/fp16/loss_scaler.py`` and ``fused_optimizer.py``) starts at
    ``2**initial_scale_power``, halves the scale on an overflow (after ``hysteresis``
    overflows; 1 backs off on every one, as GradScaler does) but never below
    ``min_loss_scale``, and doubles it when ``(step - last_overflow_step - 1)`` is a positive
    multiple of ``loss_scale_window``: after ``window + 1`` clean steps, then every ``window``.
    Under ZeRO an overflow *at* ``min_loss_scale`` raises and ends training.
    """
    power = math.log2(c.init_scale)
    nearest = max(round(power), 0)
    if c.init_scale < DEEPSPEED_MIN_LOSS_SCALE:
        parts.lost.append(
            f"init_scale={c.init_scale!r}: DeepSpeed's scale never goes below "
            f"min_loss_scale={DEEPSPEED_MIN_LOSS_SCALE} (the smallest its config "
            "takes); nearest: initial_scale_power 0 = 1.0"
        )
    elif power != round(power):
        parts.lost.append(
            f"init_scale={c.init_scale!r} is not a power of two; nearest: "
            f"initial_scale_power {nearest} = {2.0**nearest!r}"
        )
    if c.growth_factor != 2.0:
        parts.lost.append(f"growth_factor={c.growth_factor!r}: DeepSpeed always grows by 2")
    if c.backoff_factor != 0.5:
        parts.lost.append(f"backoff_factor={c.backoff_factor!r}: DeepSpeed always backs off by 0.5")
    if lowest is not None and lowest < DEEPSPEED_MIN_LOSS_SCALE <= c.init_scale:
        parts.lost.append(
            f"the search's runs of this config backed the scale off to {lowest:.3g}; "
            f"DeepSpeed stops at {DEEPSPEED_MIN_LOSS_SCALE}, and under ZeRO an "
            "overflow there ends training"
        )
    window = c.growth_interval
    parts.differ.append(
        f"growth: DeepSpeed doubles the scale after loss_scale_window+1 = {window + 1} clean "
        f"steps (after an overflow or the start), then every {window}: each growth comes 1 step "
        f"later than GradScaler's ({window}, {2 * window}, ...)"
    )
    floor = (
        f"; in the search this config's scale stayed at or above {lowest:.3g}"
        if lowest is not None and lowest >= DEEPSPEED_MIN_LOSS_SCALE
        else ""
    )
    parts.differ.append(
        f"minimum: DeepSpeed never lowers the scale below min_loss_scale="
        f"{DEEPSPEED_MIN_LOSS_SCALE}, and under ZeRO (stages 1-3) an overflow at that minimum "
        f"raises and ends training: from 2**{nearest} that is {nearest + 1} overflow"
        f"{'s' if nearest else ''} in a row without a growth between (without ZeRO it skips the "
        "step and stays at 1). GradScaler "
        f"keeps multiplying the scale by backoff_factor{floor}"
    )
    return deepspeed_fp16_block(c)


#: The writers of the frameworks that run under autocast on a device (DeepSpeed's JSON is
#: written by :func:`_deepspeed`, from the search's evidence and the batch size).
_WRITERS: dict[str, Callable[[AmpConfig, Device], Parts]] = {
    "torch": _torch,
    "lightning": _lightning,
    "accelerate": _accelerate,
    "transformers": _transformers,
}


def _torch_float8(c: AmpConfig, device: Device) -> Parts:
    return _torchao.torchao(c, device, clip=True)


def _lightning_float8(c: AmpConfig, device: Device) -> Parts:
    parts = _lightning(_torchao.around(c), device)
    _torchao.converted_before(parts, c, device, "before trainer.fit(...)")
    return parts


def _transformers_float8(c: AmpConfig, device: Device) -> Parts:
    parts = _transformers(_torchao.around(c), device)
    _torchao.converted_before(parts, c, device, "before transformers.Trainer(model=model, ...)")
    return parts


#: The writers of a float8 config: torchao's conversion, and the framework's settings of the
#: precision around it.
_FLOAT8_WRITERS: dict[str, Callable[[AmpConfig, Device], Parts]] = {
    "torch": _torch_float8,
    "torchao": _torchao.torchao,
    "lightning": _lightning_float8,
    "accelerate": _torchao.accelerate,
    "transformers": _transformers_float8,
    "torchtitan": _torchtitan.torchtitan,
}

#: The frameworks exported for a float8 config only.
_FLOAT8_ONLY = ("torchao", "torchtitan")
