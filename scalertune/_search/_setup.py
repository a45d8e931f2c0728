"""What one worker of a search works with: the workload, the space, the device and the horizon."""

from __future__ import annotations

import dataclasses
import os
import platform
from collections.abc import Callable, Collection, Mapping
from typing import Any

import torch

from scalertune import _limits, _policy
from scalertune._amp import _float8, _torchao_private
from scalertune._amp._config import FLOAT8_KNOBS, AmpConfig
from scalertune._amp._device import resolve_device
from scalertune._amp._float8 import left_out_line, not_linear_line
from scalertune._amp._modules import kept_in_float32
from scalertune._errors import ParameterError, UsageError
from scalertune._inrun._float8_layers import LayerCast, island_candidates, iter_lines, spoiling
from scalertune._judge._settings import StudySettings
from scalertune._processes._main_guard import refuse_reentry, refuse_unguarded
from scalertune._run._preflight import preflight
from scalertune._search._deepspeed import SPACE_KEYS
from scalertune._search._launch import preflight_ranks
from scalertune._search._options import Isolation, SearchOptions
from scalertune._search._policy import FLOAT8_ISLAND_CANDIDATES
from scalertune._search._space import SearchSpace
from scalertune._storage._store import normalized
from scalertune._text import plural
from scalertune._workload._factory import exits_raised
from scalertune._workload._loader import FactoryError, factory_name, load_factory


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every trial of one worker shares: the study's settings (the record the study
    stores), and what this worker runs them with."""

    spec: str | Callable[[], Any]
    factory: Callable[[], Any]
    space: SearchSpace
    device: torch.device
    n_trials: int
    settings: StudySettings
    isolation: Isolation | None
    #: Where the study's artifacts go, as given (a folder or ``s3://BUCKET``); ``None``: the
    #: study's recorded place, else beside its storage (:mod:`scalertune._storage._store`).
    artifact_dir: str | None = None
    #: What the search says before it starts (the Linear layers float8 leaves out).
    notes: tuple[str, ...] = ()
    #: What float8 under each recipe costs each Linear layer on the first batch, at the
    #: initial weights every run starts from (the in-run check's own measure).
    float8_casts: tuple[LayerCast, ...] = ()

    def float8_spoils(self, config: AmpConfig) -> str | None:
        """Why a float8 ``config`` loses a layer from its first step (``None``: it loses
        none): under its recipe, a layer outside its islands whose output float8 puts far
        off float32's on the first batch. The in-run check moves such a config off its
        recipe (or the layer out of float8) at its first check, so it is never what a run
        of it trains: the search prunes it there, with the same line. So is a float8 config
        that keeps every layer float8 takes out of it: it trains as its precision around
        float8 would, and would be timed as float8."""
        idle = self.float8_idle(config)
        if idle is not None:
            return idle
        cast = spoiling(self.float8_casts, config)
        if cast is None:
            return None
        return (
            f"{cast.line()} on the first batch: the in-run check would move it off this "
            "recipe at its first check"
        )

    def float8_idle(self, config: AmpConfig) -> str | None:
        """Why a float8 ``config`` trains no layer in float8 (``None``: it trains some): its
        islands hold every Linear layer float8 takes."""
        if not config.float8:
            return None
        held = _float8.islands_hold_all(config, sorted({c.name for c in self.float8_casts}))
        return None if held is None else f"float8 {config.float8_recipe}: its {held}"

    @property
    def steps(self) -> int:
        return self.settings.steps

    @property
    def seed(self) -> int:
        return self.settings.seed

    @property
    def horizon(self) -> int:
        return self.settings.horizon

    @property
    def long(self) -> bool:
        return self.settings.long

    @property
    def windows(self) -> list[tuple[int, int]]:
        return self.settings.windows

    @property
    def clip_norm(self) -> float | None:
        """The workload's own clipping: every run without a clip of its own uses it."""
        return self.settings.clip_norm


def prepare(factory: str | Callable[[], Any], options: SearchOptions) -> Setup:
    """Everything a search checks before it writes anything (its numbers were checked with
    ``options``): its space, the device, the factory and one float32 step of it (in every
    rank with ``nproc_per_node`` > 1, whose runs are all isolated; ``None``: the factory's
    ``nproc_per_node`` attribute, else 1); the setup, with the study's settings."""
    refuse_reentry()
    refuse_launcher()
    given = options.artifact_dir
    location = None if given is None else normalized(given)
    space = options.space
    space = space if isinstance(space, SearchSpace) else SearchSpace.load(space)
    if options.fp32_modules:
        space = space.with_islands(options.fp32_modules)
    dev = resolve_device(options.device)
    searched = _float8_space(space, dev)
    user_factory = load_factory(factory, isolated=options.isolation is not None)
    isolation = _processes(factory, user_factory, options.nproc_per_node, options.isolation)
    checked = _preflight(factory, user_factory, dev, options.seed, searched, isolation)
    # a DeepSpeed workload keeps the space it named: its engine trains no float8
    space = _space_for(space if checked.deepspeed else searched, checked.deepspeed)
    _float8_takes(space, checked)
    islands = [
        name  # a layer every run keeps out already (--fp32-modules) is no choice
        for name in island_candidates(list(checked.float8_casts), at_most=FLOAT8_ISLAND_CANDIDATES)
        if name not in space.fixed_islands
    ]
    if islands and "float8_islands" not in space.params:
        takes = {c.name for c in checked.float8_casts}
        space = with_float8_islands(
            space, islands, takes=[n for n in takes if not kept_in_float32(n, space.fixed_islands)]
        )
    steps, fitted = _trial_steps(options, checked.horizon)
    settings = _settings(factory, options, steps, space, dev, checked, isolation)
    return Setup(
        spec=factory,
        factory=user_factory,
        space=space,
        device=dev,
        n_trials=options.n_trials,
        settings=settings,
        isolation=isolation,
        artifact_dir=location,
        notes=(*fitted, *_float8_notes(checked)),
        float8_casts=tuple(checked.float8_casts),
    )


def _trial_steps(options: SearchOptions, declared: int | None) -> tuple[int, tuple[str, ...]]:
    """A trial's steps: ``--steps``, or all of a declared training shorter than the default
    (a Trainer's ``max_steps`` of 150: a trial of 200 would train past its end), said in one
    line (a shorter one asked for with ``--steps`` is refused); and a ``--horizon`` past the
    declared training's end, said too."""
    steps = options.steps
    if declared is None:
        return steps, ()
    fits = _limits.SEARCH["steps"].low <= declared < steps
    if options.horizon is None and steps == _policy.SEARCH_STEPS and fits:
        return declared, (
            f"the factory's training is {declared} steps, fewer than a trial's default "
            f"{steps}: each trial trains all {declared} (--steps chooses fewer)",
        )
    if options.horizon is not None and options.horizon > declared:
        return steps, (
            f"--horizon {options.horizon} is longer than the factory's training ({declared} "
            "steps): the runs train past its end (a Trainer's learning-rate schedule has "
            "ended there)",
        )
    return steps, ()


def _float8_takes(space: SearchSpace, checked: Any) -> None:
    """Refuse a float8 space for a model float8 takes no layer of: nothing would run in it."""
    if "float8" in space.dtypes and not checked.float8_layers:
        raise UsageError(
            "no Linear layer of the model takes float8 (none whose sizes are both multiples "
            f"of {_float8.FLOAT8_MULTIPLE} ran in its first step), so float8 would train "
            "nothing in float8: search float16 or bfloat16 (--space default)"
        )


def _float8_notes(checked: Any) -> tuple[str, ...]:
    """The lines a float8 search says first: the layers left out, and what float8 spoils."""
    left_out = [left_out_line(checked.float8_left_out)] if checked.float8_left_out else []
    if checked.float8_not_linear:
        left_out.append(not_linear_line(checked.float8_not_linear))
    casts = list(checked.float8_casts)
    spoiled = list(iter_lines(casts))
    if casts and not spoiled:  # said too: the layers were looked at, and none is spoiled
        recipes = ", ".join(dict.fromkeys(c.recipe for c in casts))
        worst = max(c.error for c in casts)
        spoiled = [
            f"float8: {checked.float8_layers} Linear layers take float8; on the first batch "
            f"{recipes} spoil none (every output within {worst:.0%} of float32's)"
        ]
    return (*left_out, *spoiled)


def _settings(
    factory: str | Callable[[], Any],
    options: SearchOptions,
    steps: int,
    space: SearchSpace,
    dev: torch.device,
    checked: Any,
    isolation: Isolation | None,
) -> StudySettings:
    """The study's settings: what every worker and every rerun must share."""
    declared = checked.horizon
    if options.horizon is None and declared is not None:
        declared = _declared_horizon(declared, factory_name(factory), steps)
    return StudySettings(
        factory=factory_name(factory),
        steps=steps,
        horizon=_limits.horizon(steps, options.horizon, declared),
        seed=options.seed,
        space=space.to_dict(),
        device_type=dev.type,
        device=describe_device(dev),
        reference=checked.reference,
        nproc_per_node=isolation.nproc_per_node if isolation is not None else 1,
        nnodes=isolation.nnodes if isolation is not None else 1,
        hosts=isolation.hosts if isolation is not None else (),
        deepspeed=checked.deepspeed,
        model=checked.model,
    )


def _preflight(
    factory: str | Callable[[], Any],
    user_factory: Callable[[], Any],
    dev: torch.device,
    seed: int,
    space: SearchSpace,
    isolation: Isolation | None,
) -> Any:
    """One float32 step of the factory (in every rank, on ranks; in a process of its own,
    isolated), before anything is written; the factory's own error as one line."""
    try:
        # isolated, the factory's first call runs in a process of its own too, under the
        # trial's time limit: a factory that hangs, or ends its process, is one line
        if isolation is not None:
            return preflight_ranks(
                factory,
                device=dev,
                seed=seed,
                islands=space.island_names,
                timeout_s=isolation.timeout_s,
                ranks=isolation.nproc_per_node,
                float8_recipes=float8_recipes(space),
                independent_ranks=isolation.independent_ranks,
            )
        with exits_raised():  # os._exit in its first step: one line, not a silent exit
            return preflight(
                user_factory,
                device=dev,
                seed=seed,
                islands=space.island_names,
                float8_recipes=float8_recipes(space),
            )
    except FactoryError as exc:
        raised = "raised " if exc.raised else ""
        said = str(exc).rstrip(".")
        if _NO_GROUP in said:  # DDP or FSDP, in a world of one process
            raise UsageError(
                f"the factory {factory_name(factory)} {raised}{said}: it wraps its model for "
                "ranks, and this search runs one process: give --nproc-per-node K on one "
                "host, or launch it under torchrun or srun as your training runs (the same "
                "--nnodes and --nproc-per-node on every host)"
            ) from None
        raise UsageError(
            f"the factory {factory_name(factory)} {raised}{said}: fix it and rerun"
        ) from None


#: What torch says where a model is wrapped for ranks with no process group (one process).
_NO_GROUP = "process group has not been initialized"


def _space_for(space: SearchSpace, deepspeed: Any) -> SearchSpace:
    """The space in the knobs of the scaler the workload trains under: DeepSpeed's for a
    DeepSpeed workload (bfloat16 where the device runs it), GradScaler's for any other."""
    if deepspeed is not None:
        if "float8" in space.dtypes:
            raise UsageError(
                f"search space {space.name!r} tries float8, which DeepSpeed's engine does not "
                "train (its fp16 and bf16 modes): search float8 on the model without the "
                "DeepSpeed config"
            )
        return space.for_deepspeed(bfloat16=bool(deepspeed.get("bfloat16")))
    named = sorted(k for k in space.params if k in SPACE_KEYS)
    if named:
        raise UsageError(
            f"search space {space.name!r} names {', '.join(named)}, DeepSpeed's loss scaler's "
            "knobs, and the workload does not train in DeepSpeed: drop them, or return the "
            "DeepSpeed config from the factory ('deepspeed': config)"
        )
    return space


def _float8_space(space: SearchSpace, dev: torch.device) -> SearchSpace:
    """The space with float8 where it belongs: the default space gains it on a device with
    float8 matmuls (CUDA capability 8.9+) where torchao is installed (a DeepSpeed workload
    keeps the space it had: :func:`prepare`); a space that names it is refused in one line
    where it cannot run (no torchao, a GPU that would only emulate it and time the
    emulation), before the factory is loaded."""
    if "float8" not in space.dtypes:
        if space.name != "default" or not _float8.native(dev):
            return space
        if not _torchao_private.RELEASES.takes(_torchao_private.RELEASES.installed() or ""):
            return space
        return with_float8(space)
    _torchao_private.torchao_float8()  # one line naming what to install, where it is missing
    if dev.type == "cuda" and not _float8.native(dev):
        major, minor = torch.cuda.get_device_capability(dev)
        raise UsageError(
            f"{describe_device(dev)} has no float8 matmuls (CUDA capability {major}.{minor}; "
            f"float8 needs {'.'.join(map(str, _float8.FLOAT8_CAPABILITY))} or higher): torchao "
            "would emulate them and the search would time the emulation; search float8's "
            "numerics on a CPU, or on a GPU with float8"
        )
    return space


def float8_recipes(space: SearchSpace) -> tuple[str, ...]:
    """The float8 recipes the space tries (none where it does not try float8)."""
    if "float8" not in space.dtypes:
        return ()
    spec = space.params.get("float8_recipe", AmpConfig().float8_recipe)
    return tuple(spec["choices"]) if isinstance(spec, Mapping) else (spec,)


def with_float8_islands(
    space: SearchSpace, names: list[str], *, takes: Collection[str] | None = None
) -> SearchSpace:
    """The same space where float8 trials may also keep one of ``names``, or all, out of
    float8 (in float32): the layers the evidence says float8 spoils.

    Args:
        space: The space.
        names: Module names, worst first.
        takes: The layers float8 would train (those of the model float8 takes, less the
            space's own islands; ``None``: not known): a choice that keeps all of them out,
            which would train no layer in float8, is left out.

    Returns:
        A new space with ``float8_islands`` choices: none, each name alone, and, for more
        than one, all of them together (as the in-run check keeps every layer a recipe spoils
        out at once: one recipe may spoil one layer, another a second); the same space where
        no choice but none is left.

    Example:
        >>> from scalertune import SearchSpace
        >>> space = with_float8_islands(SearchSpace.load("float8"), ["0", "2"])
        >>> space.params["float8_islands"]
        {'choices': ['', '0', '2', '0,2']}
    """
    together = [",".join(names)] if len(names) > 1 else []
    choices = [
        c for c in [*names, *together] if takes is None or not set(takes) <= set(c.split(","))
    ]
    if not choices:
        return space
    return SearchSpace.from_dict(
        {**space.params, "float8_islands": {"choices": ["", *choices]}},
        name=space.name,
        description=space.description,
    )


def with_float8(space: SearchSpace) -> SearchSpace:
    """The same space trying float8 too, with the shipped float8 space's knobs.

    A search does this to the default space on a GPU with float8 matmuls.

    Args:
        space: The space.

    Returns:
        A new space, named ``NAME+float8``.

    Example:
        >>> from scalertune import SearchSpace
        >>> with_float8(SearchSpace.load("default")).dtypes
        ('float16', 'bfloat16', 'float8')
    """
    float8 = SearchSpace.load("float8").params
    dtypes = [*space.dtypes, *(d for d in float8["dtype"]["choices"] if d not in space.dtypes)]
    knobs = {k: float8[k] for k in FLOAT8_KNOBS if k in float8 and k not in space.params}
    return SearchSpace.from_dict(
        {**space.params, "dtype": {"choices": dtypes}, **knobs},
        name=f"{space.name}+float8",
        description=space.description,
    )


def _processes(
    factory: str | Callable[[], Any],
    user_factory: Callable[[], Any],
    nproc_per_node: int | None,
    isolation: Isolation | None,
) -> Isolation | None:
    """How the runs are started: ``isolation`` with the processes per run given, else those
    the factory declares; refused now where each started process would run the caller's
    script's search again."""
    if nproc_per_node is None:
        nproc_per_node = declared_nproc(user_factory, factory_name(factory))
    if nproc_per_node > 1:
        if isolation is None:
            load_factory(factory, isolated=True)  # each rank imports it again
        isolation = dataclasses.replace(isolation or Isolation(), nproc_per_node=nproc_per_node)
    if isolation is not None:
        refuse_unguarded()
    return isolation


def declared_nproc(factory: Callable[[], Any], name: str) -> int:
    """The processes per run the factory declares as its ``nproc_per_node`` attribute (a
    DDP or FSDP factory cannot be called outside a process group, so it is declared on the
    function, read before any call, not returned), held to ``--nproc-per-node``'s range;
    1 when it declares none."""
    declared = getattr(factory, "nproc_per_node", None)
    if declared is None:
        return 1
    _check_declared(name, "nproc_per_node", declared)
    return int(declared)


def _check_declared(factory: str, name: str, value: Any) -> None:
    """A value the factory declares, held to the range of the flag that sets it, in one
    line naming both."""
    try:
        _limits.check(_limits.SEARCH, **{name: value})
    except ParameterError as exc:
        flag = "--" + name.replace("_", "-")
        raise UsageError(
            f"the factory {factory} declares {name} {value!r}, which "
            f"{exc.problem.split(', got')[0]}: declare another, or pass {flag}"
        ) from None


def _declared_horizon(horizon: int, factory: str, steps: int) -> int:
    """The horizon the factory declares, held to the same range as ``--horizon``."""
    _check_declared(factory, "horizon", horizon)
    if horizon < steps:
        raise UsageError(
            f"the factory {factory} declares horizon {horizon}, shorter than a "
            f"trial's {steps} steps (--steps): pass --steps {horizon} or fewer, or "
            f"declare at least {steps}"
        )
    return horizon


def refuse_launcher() -> None:
    """A search started by torchrun (or another launcher) from Python would run once per
    rank, each its own search of one process: refused, in one line (the command line leads
    the launcher's ranks instead: :mod:`scalertune._processes._hosts`)."""
    from scalertune._processes import _launcher

    world = int(os.environ.get("WORLD_SIZE") or 1)
    if world > 1 and "RANK" in os.environ and not _launcher.leading():
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or world)
        alone = (
            f"run it once, without the launcher, with nproc_per_node={per_node} (it starts the "
            "ranks of every run itself), or "
            if per_node == world
            else ""
        )
        raise UsageError(
            f"this search runs as rank {os.environ['RANK']} of {world} under a "
            f"launcher (torchrun): {alone}run the command 'python -m scalertune search' under "
            "the launcher, which leads its ranks"
        )


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    threads = torch.get_num_threads()
    return f"{device.type} ({platform.machine()}, {plural(threads, 'thread')})"
