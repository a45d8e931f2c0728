"""The releases of another project that scalertune was checked on, and the one line that
refuses another: the fence every private name of a framework (``_frameworks``) or of torchao
(``_amp._torchao_private``) stands behind."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
from importlib import metadata
from typing import Any

from scalertune._errors import UsageError


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
    lowest: tuple[int, ...]
    below: tuple[int, ...]
    checked: str

    @property
    def requirement(self) -> str:
        """The bound as pip writes it (``pyproject.toml`` declares the same)."""
        low, high = (".".join(map(str, v)) for v in (self.lowest, self.below))
        return f"{self.distribution}>={low},<{high}"

    def takes(self, version: str) -> bool:
        """Whether ``version`` is inside the bound (a pre-release counts as its release); a
        bound of three numbers compares the patch release too."""
        found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
        if found is None:
            return False
        parts = tuple(int(p or 0) for p in found.groups())
        return self.lowest <= parts[: len(self.lowest)] and parts[: len(self.below)] < self.below

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
