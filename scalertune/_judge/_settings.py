"""A study's settings, as one typed record: written by the search when it creates the study,
read back by every worker that joins it and by everything that reviews it.

The rules about the horizon, the trial and the phase windows live here, and nowhere else:

- the **horizon** is the training the evidence covers: ``--horizon``, else the factory's, else
  the trial's ``steps``, never shorter than a trial (:func:`scalertune._limits.horizon`,
  which the command line also runs before torch loads);
- a horizon **longer** than a trial (:attr:`StudySettings.long`) is covered in phase windows:
  the float32 reference trains to it, and the finalists are trained or branched there;
- the **windows** (:attr:`StudySettings.windows`): one from the middle of the horizon and one
  ending at it, each ``PHASE_WINDOW_SHARE`` of the horizon long and at least a trial long;
- over a long horizon, a **tie** in steps to the target is float32's seed spread of the
  horizon, not of the trial (:meth:`StudySettings.noise`).

Stored as the study user attribute ``scalertune.settings`` (:meth:`StudySettings.to_dict`,
with its ``version``); :meth:`StudySettings.from_dict` reads every version a study may hold.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from optuna.distributions import CategoricalDistribution

from scalertune import _limits, _policy
from scalertune._amp._config import DTYPES, AmpConfig
from scalertune._errors import DamagedEvidence, UsageError
from scalertune._storage._names import SETTINGS_ATTR

if TYPE_CHECKING:
    import optuna

#: The record's format, stored with it. 2: this record. 1: the settings a search stored
#: before they had a version (the same keys; ``horizon`` missing in the first studies, which
#: covered the trial alone, and ``reference`` and ``instance`` in some).
VERSION = 2
#: The settings whose change makes stored trials incomparable with new ones: a rerun of a
#: search with another of these is refused. The horizon too: the study's evidence (the float32
#: reference trained to it, its checkpoints and trace, the phase windows, the answer's claim)
#: is for the horizon it was created with, and a rerun that took another would mix evidence
#: over two horizons, or leave the one asked for unmet while saying otherwise.
COMPARABLE = (
    "factory",
    "steps",
    "horizon",
    "seed",
    "space",
    "device_type",
    "reference",
    "nproc_per_node",
    "nnodes",
    "deepspeed",
)


@dataclasses.dataclass(frozen=True)
class StudySettings:
    """What a study was created with: workload, trial, horizon, space, device, reference.

    The float32 reference's config is float32 with the workload's own clipping. The search
    writes this record when it creates the study; every worker that joins it and everything
    that reviews it reads it back (``SearchResult.settings``).

    Raises:
        ParameterError: ``horizon`` is shorter than a trial's ``steps``.

    Example:
        >>> from scalertune import StudySettings
        >>> s = StudySettings(factory="model.py:make_model", steps=200, horizon=2000, seed=0,
        ...                   space={"name": "default", "params": {}}, device_type="cpu",
        ...                   device="cpu (x86_64, 2 threads)")
        >>> s.long, s.windows
        (True, [(1000, 1200), (1800, 2000)])
        >>> StudySettings.from_dict(s.to_dict()) == s
        True
    """

    factory: str
    steps: int
    #: The steps of training the evidence covers (``steps`` when no longer horizon is asked).
    horizon: int
    seed: int
    #: The search space as :meth:`scalertune.SearchSpace.to_dict` writes it (name, params).
    space: Mapping[str, Any]
    device_type: str
    #: The device in words: ``cpu (x86_64, 2 threads)``, ``cuda:0 (NVIDIA H100)``.
    device: str
    #: The float32 reference's config: float32 with the workload's own clipping, if any.
    reference: AmpConfig = AmpConfig(dtype="float32")
    #: The token the study got when it was created (see ``_search._study.instance``).
    instance: str = ""
    version: int = VERSION
    #: The processes every run trains on (``--nproc-per-node``): 1, or the ranks of a
    #: ``torch.distributed`` group (studies written before it: 1).
    nproc_per_node: int = 1
    #: The hosts every run spans under the user's launcher (``torchrun --nnodes``, ``srun``),
    #: ``nproc_per_node`` ranks on each (studies written before it, and one host: 1).
    nnodes: int = 1
    #: Their names, in node order (recorded, not compared: a scheduler gives other hosts).
    hosts: tuple[str, ...] = ()
    #: For a DeepSpeed workload, the engine every run trains in (``zero_stage``,
    #: ``bfloat16``); ``None`` for any other (and studies written before it).
    deepspeed: Mapping[str, Any] | None = None
    #: The fingerprint of the model searched (``_amp._fingerprint``: its parameters' names
    #: and shapes), which the result file carries; ``None`` for studies written before it.
    model: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        _limits.check_horizon(self.steps, self.horizon)

    @property
    def long(self) -> bool:
        """Whether the horizon goes past a trial: then the reference trains to it, and the
        finalists get evidence in its phase windows."""
        return self.horizon > self.steps

    @property
    def windows(self) -> list[tuple[int, int]]:
        """The (first step, end) of each phase window: one from the middle of the horizon and
        one ending at it, each ``PHASE_WINDOW_SHARE`` of the horizon long and at least a
        trial long, starting at a multiple of ``READBACK_INTERVAL`` (the end alone when both
        do not fit); none when the horizon is the trial (the trial is the evidence)."""
        if not self.long:
            return []
        unit = _policy.READBACK_INTERVAL
        width = max(self.steps, round(_policy.PHASE_WINDOW_SHARE * self.horizon / unit) * unit)
        width = min(width, self.horizon)
        # A window starts where the reference can save a checkpoint: at the end of one of its
        # read-back windows, never at step 0 (the end window of a horizon that is no multiple
        # of the interval grows by the remainder; one barely past a trial is shorter than a
        # trial).
        end_window = (max(unit, (self.horizon - width) // unit * unit), self.horizon)
        middle = max(self.steps, round(self.horizon / 2 / unit) * unit)
        if middle + width > end_window[0]:
            return [end_window]
        return [(middle, middle + width), end_window]

    def noise(self, spread: float) -> Noise:
        """What counts as a tie in steps to the target.

        Args:
            spread: float32's seed-to-seed spread of its steps to the target, as a share.

        Returns:
            The tie margin: the spread as a share of the trial's steps or, over a long horizon,
            of the horizon (a head start of a few steps is nothing over the training the answer
            is for).

        Example:
            >>> from scalertune import StudySettings
            >>> s = StudySettings(factory="m.py:f", steps=200, horizon=2000, seed=0, space={},
            ...                   device_type="cpu", device="cpu")
            >>> s.noise(0.05).margin(150)
            100.0
        """
        return Noise(spread, self.horizon if self.long else 0)

    @property
    def zero(self) -> bool:
        """Whether the runs train under ZeRO, whose scaler raises at its minimum (the
        replay's rule for a DeepSpeed config)."""
        return self.deepspeed is not None and int(self.deepspeed.get("zero_stage", 1)) > 0

    @property
    def loss_floor(self) -> float:
        """The least largest gradient of a float16 step: 1 where a DeepSpeed workload's loss
        is float16 (its backward starts from the scale itself), else 0."""
        return 1.0 if self.deepspeed is not None and self.deepspeed.get("half_loss") else 0.0

    @property
    def clip_norm(self) -> float | None:
        """The workload's own clipping: every run without a clip of its own uses it."""
        return self.reference.clip_norm

    @property
    def space_name(self) -> str:
        """The search space's name."""
        return str(self.space.get("name", ""))

    @property
    def space_dtypes(self) -> tuple[str, ...]:
        """The dtypes the space searches (float16 where the space does not say)."""
        return space_dtypes(self.space.get("params") or {})

    @property
    def dtype_distribution(self) -> CategoricalDistribution:
        """The distribution of the ``dtype`` parameter of every run of the study."""
        return CategoricalDistribution(dtype_choices(self.space.get("params") or {}))

    @property
    def stored(self) -> bool:
        """Whether the study had settings (a study not made by ``scalertune search`` has
        none: see :meth:`of`)."""
        return self.version > 0

    def differs_from(self, other: StudySettings) -> str | None:
        """The first of the settings a rerun must share that differs from ``other``'s.

        Args:
            other: The settings a rerun or another worker brings.

        Returns:
            The name of the first differing setting (factory, steps, horizon, seed, space,
            device_type, reference, nproc_per_node, nnodes, deepspeed, then ``model``: the
            parameters' names and shapes, where both fingerprinted theirs), or ``None`` when
            they agree.

        Example:
            >>> import dataclasses
            >>> from scalertune import StudySettings
            >>> s = StudySettings(factory="m.py:f", steps=200, horizon=200, seed=0, space={},
            ...                   device_type="cpu", device="cpu")
            >>> s.differs_from(dataclasses.replace(s, seed=1))
            'seed'
        """
        mine, theirs = self.to_dict(), other.to_dict()
        key = next((key for key in COMPARABLE if mine.get(key) != theirs.get(key)), None)
        if key is not None or self.model is None or other.model is None:
            return key
        return "model" if self.model.get("sha256") != other.model.get("sha256") else None

    def to_dict(self) -> dict[str, Any]:
        """The record as the study stores it (the ``scalertune.settings`` user attribute).

        Returns:
            Plain types, with the record's ``version``.

        Example:
            >>> from scalertune import StudySettings
            >>> s = StudySettings(factory="m.py:f", steps=200, horizon=200, seed=0, space={},
            ...                   device_type="cpu", device="cpu")
            >>> s.to_dict()["version"], s.to_dict()["reference"]
            (2, {'dtype': 'float32', 'clip_norm': None})
        """
        return {
            "version": self.version,
            "factory": self.factory,
            "steps": self.steps,
            "horizon": self.horizon,
            "seed": self.seed,
            "space": {
                "name": self.space.get("name"),
                "params": dict(self.space.get("params") or {}),
            },
            "device_type": self.device_type,
            "device": self.device,
            "reference": self.reference.to_dict(),
            "instance": self.instance,
            "nproc_per_node": self.nproc_per_node,
            **({"nnodes": self.nnodes, "hosts": list(self.hosts)} if self.nnodes > 1 else {}),
            "deepspeed": None if self.deepspeed is None else dict(self.deepspeed),
            **({"model": dict(self.model)} if self.model is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StudySettings:
        """Read the record as stored, in any version a study may hold.

        Args:
            data: What :meth:`to_dict` wrote, in this version or an earlier one.

        Returns:
            The settings.

        Raises:
            UsageError: The record is of a newer version than this scalertune reads: upgrade
                scalertune to review the study.
            DamagedEvidence: The record is not one this scalertune wrote (a study's storage
                is written by others too): named in one line.

        Example:
            >>> from scalertune import StudySettings
            >>> StudySettings.from_dict({"factory": "m.py:f", "steps": 200, "seed": 0}).horizon
            200
        """
        try:
            version = int(data.get("version") or 1)
        except (AttributeError, TypeError, ValueError):
            raise DamagedEvidence(_damaged("it is not a record of settings")) from None
        if version > VERSION:
            raise UsageError(
                f"the study's settings are of version {version}, newer than this "
                f"scalertune reads ({VERSION}): upgrade scalertune to review it"
            )
        try:
            settings = _read(cls, data, version)
        except UsageError:
            raise DamagedEvidence(_damaged("its reference is not an AMP config")) from None
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
            raise DamagedEvidence(_damaged(f"{type(exc).__name__}: {str(exc)[:200]}")) from None
        if not (
            0 < settings.steps <= settings.horizon <= _limits.MAX_HORIZON
            and 0 < settings.nproc_per_node <= 2**16
            and 0 < settings.nnodes <= 2**16
            and re.fullmatch("[0-9a-f]{0,64}", settings.instance)
        ):
            raise DamagedEvidence(
                _damaged("its steps, horizon, ranks or instance are out of bounds")
            )
        return settings

    @classmethod
    def of(cls, study: optuna.Study) -> StudySettings:
        """The settings ``study`` was created with.

        Args:
            study: An Optuna study.

        Returns:
            The settings; for a study that holds none (not made by a search), a record of
            ``version`` 0 that says so (:attr:`stored`).

        Raises:
            UsageError: The study's settings are of a newer version than this scalertune reads.

        Example:
            >>> import optuna
            >>> from scalertune import StudySettings
            >>> StudySettings.of(optuna.create_study()).stored
            False
        """
        stored = study.user_attrs.get(SETTINGS_ATTR)
        if stored is None:
            return cls(
                factory="",
                steps=0,
                horizon=0,
                seed=0,
                space={},
                device_type="",
                device="this device",
                version=0,
            )
        return cls.from_dict(stored)


@dataclasses.dataclass(frozen=True)
class Noise:
    """How many steps to the target are a tie: float32's seed-to-seed spread of them, as a
    share of the steps, or, over a horizon longer than a trial, of the horizon (a head start
    of a few steps is nothing over the training the answer is for): ``horizon`` is 0 where
    it is the trial (see :meth:`StudySettings.noise`)."""

    spread: float = 0.0
    horizon: int = 0

    def margin(self, steps: float) -> float:
        return self.spread * max(steps, self.horizon)


def dtype_choices(params: Mapping[str, Any]) -> list[str]:
    """The choices of the one ``dtype`` parameter every run of a study records (Optuna keeps
    one distribution per parameter and study): float16, bfloat16, float32, and float8 in a
    study whose space searches it (a study made before float8 keeps its three)."""
    return [*DTYPES, "float8"] if "float8" in space_dtypes(params) else list(DTYPES)


def space_dtypes(params: Mapping[str, Any]) -> tuple[str, ...]:
    """The dtypes a space's ``params`` search: the choices of ``dtype``, or its one value;
    float16 where the space does not name a dtype."""
    dtype = params.get("dtype", {"choices": ["float16"]})
    return tuple(dtype["choices"]) if isinstance(dtype, Mapping) else (dtype,)


def _damaged(why: str) -> str:
    return (
        f"the study's settings ({SETTINGS_ATTR}) are damaged: {why}; a study cannot be judged "
        "without them: search into a new --study-name"
    )


def _read(cls: type[StudySettings], data: Mapping[str, Any], version: int) -> StudySettings:
    """The settings in ``data``, stored in ``version``'s form (fields a version lacks take
    their defaults)."""
    steps = int(data["steps"])
    return cls(
        factory=str(data["factory"]),
        steps=steps,
        horizon=int(data.get("horizon") or steps),
        seed=int(data["seed"]),
        space=dict(data.get("space") or {}),
        device_type=str(data.get("device_type") or ""),
        device=str(data.get("device") or "this device"),
        reference=AmpConfig.from_dict(data.get("reference") or {"dtype": "float32"}),
        instance=str(data.get("instance") or ""),
        version=version,
        nproc_per_node=int(data.get("nproc_per_node") or 1),
        nnodes=int(data.get("nnodes") or 1),
        hosts=tuple(str(h) for h in data.get("hosts") or ()),
        deepspeed=data.get("deepspeed"),
        model=dict(data["model"]) if isinstance(data.get("model"), Mapping) else None,
    )
