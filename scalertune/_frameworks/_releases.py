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

from typing import Any

from scalertune._releases import Releases, has_path, importable

__all__ = ["Releases", "comes_from", "defining_package", "has_path", "importable"]

#: The top-level packages of the frameworks scalertune takes objects from.
FRAMEWORK_PACKAGES = ("transformers", "accelerate", "lightning", "pytorch_lightning")


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
