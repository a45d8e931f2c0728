"""Which framework a class comes from, the releases of it that scalertune was checked on, and
the one line that refuses another.

:func:`defining_package` answers, from the classes' names and modules alone (no framework is
imported, none is a dependency), which framework package defines the class of an object
(a subclass's included: TRL's trainers are Hugging Face Trainers); :func:`comes_from`, whether
one of its classes comes from a package (a TRL trainer's own class, from ``trl``).

A framework's internals that scalertune relies on (a private name, a method it replaces) are
listed in that framework's module (``_accelerate_private``, ``_transformers_private``,
``_lightning_private``), each checked by ``tests/unit/test_frameworks_private.py`` against the
installed release; ``pyproject.toml`` bounds the framework to the releases those tests passed
on, as it bounds Optuna. A framework is not a dependency, though: a user brings their own. So
the bound is checked again when a trainer is handed over (:meth:`Releases.check`), and a
release outside it, or one without a name the module lists, is refused in one line that
names the releases to install, before anything trains.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
from importlib import metadata
from typing import Any

from scalertune._errors import UsageError

#: The top-level packages of the frameworks scalertune takes objects from.
FRAMEWORK_PACKAGES = ("transformers", "accelerate", "lightning", "pytorch_lightning")


def has_path(obj: Any, path: str) -> bool:
    """Whether ``obj`` has the dotted attribute ``path`` (``"a.b"``: ``obj.a.b``)."""
    for name in path.split("."):
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def importable(module: str, path: str) -> bool:
    """Whether ``module`` imports and has the dotted attribute ``path``."""
    try:
        found = importlib.import_module(module)
    except ImportError:
        return False
    return has_path(found, path)


def defining_package(obj: Any, name: str) -> str | None:
    """The framework package (one of :data:`FRAMEWORK_PACKAGES`) whose class ``name`` is
    among the classes of ``obj``; ``None`` when none is.

    Example:
        >>> class Trainer:  # not a framework's
        ...     pass
        >>> defining_package(Trainer(), "Trainer") is None
        True
    """
    for cls in type(obj).__mro__:
        if cls.__name__ == name and _package_of(cls) in FRAMEWORK_PACKAGES:
            return _package_of(cls)
    return None


def comes_from(obj: Any, package: str) -> bool:
    """Whether one of the classes of ``obj`` (its own or a base) is defined in ``package``:
    a TRL trainer is a Hugging Face ``Trainer`` (:func:`defining_package` says
    ``transformers``) whose own class comes from ``trl``.

    Example:
        >>> import collections
        >>> comes_from(collections.OrderedDict(), "collections"), comes_from(1, "trl")
        (True, False)
    """
    return any(_package_of(cls) == package for cls in type(obj).__mro__)


def _package_of(cls: type) -> str:
    """The top-level package that defines ``cls``."""
    return cls.__module__.split(".")[0]


@dataclasses.dataclass(frozen=True)
class Releases:
    """The releases of ``distribution`` scalertune takes: ``lowest`` up to, not including,
    ``below`` (major, minor); ``checked`` is the newest one the tests passed on.

    Example:
        >>> releases = Releases("accelerate", (0, 30), (1, 17), checked="1.16")
        >>> releases.requirement
        'accelerate>=0.30,<1.17'
        >>> releases.takes("1.16.0"), releases.takes("1.17.0"), releases.takes("0.29.3")
        (True, False, False)
    """

    distribution: str
    lowest: tuple[int, int]
    below: tuple[int, int]
    checked: str

    @property
    def requirement(self) -> str:
        """The bound as pip writes it (``pyproject.toml`` declares the same)."""
        low, high = (".".join(map(str, v)) for v in (self.lowest, self.below))
        return f"{self.distribution}>={low},<{high}"

    def takes(self, version: str) -> bool:
        """Whether ``version`` is inside the bound (a pre-release counts as its release)."""
        found = re.match(r"(\d+)\.(\d+)", version)
        return found is not None and self.lowest <= (int(found[1]), int(found[2])) < self.below

    def installed(self) -> str | None:
        """The installed release (``None`` when it is not installed as a distribution)."""
        return _installed(self.distribution)

    def check(self) -> None:
        """Refuse, in one line, an installed release outside the bound."""
        version = self.installed()
        if version is not None and not self.takes(version):
            raise UsageError(
                f"scalertune drives {self.requirement} (it relies on internals a new release "
                f"may move); this is {self.distribution} {version}: "
                f"pip install '{self.requirement}'"
            )

    def missing(self, names: list[str]) -> UsageError:
        """The one line for a release that lacks ``names`` scalertune relies on."""
        return UsageError(
            f"{self.distribution} {self.installed() or '(unknown release)'} has no "
            f"{', '.join(names)}, which scalertune relies on: pip install "
            f"'{self.distribution}=={self.checked}.*', the release it was checked on"
        )


@functools.cache
def _installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
