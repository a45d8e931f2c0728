"""One description, two outputs: the objects an export builds and the code that builds them.

An export describes each object as a value of this module (a call, a name, an expression, a
function written out as source) and :func:`build` makes the object while :func:`render` writes
the code for it, so the code printed and the objects returned cannot drift apart.

Example:
    >>> imports = set()
    >>> call = Call("dataclasses:replace", (Expr("point", 1),), {"x": 2.0})
    >>> render(call, imports), sorted(imports)
    ('dataclasses.replace(point, x=2.0)', ['import dataclasses'])
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from collections.abc import Mapping
from typing import Any

from scalertune._amp._device import device_type, resolve_device
from scalertune._errors import UsageError

#: Modules the code imports whole and names in full (``torch.amp.GradScaler``,
#: ``dataclasses.replace``); from any other the code imports the name.
_WHOLE = ("torch", "dataclasses")


@dataclasses.dataclass(frozen=True)
class Call:
    """``target(*args, **kwargs)``, with ``target`` as ``"module:Name"`` (``Name`` may be
    dotted: ``"torchao.float8:Float8LinearConfig.from_recipe_name"``)."""

    target: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Expr:
    """A value that the code writes as an expression (``device == "cpu"``, ``device``)."""

    code: str
    value: Any


@dataclasses.dataclass(frozen=True)
class Name:
    """A name in a module (``torch:float16``), looked up when the objects are built: the
    code text needs no framework, and torch among them, imported."""

    target: str


@dataclasses.dataclass(frozen=True)
class Source:
    """A function the code writes out (``lines``, needing ``imports``); built, ``value``, an
    object that does what those lines do (the tests run both on one model)."""

    lines: tuple[str, ...]
    imports: tuple[str, ...]
    value: Any


@dataclasses.dataclass(frozen=True)
class Named:
    """A value the code defines once, before the rest, and then refers to by ``name``."""

    name: str
    value: Any


#: What the code calls ``model``: the user's model, which :func:`build` takes as ``model``.
MODEL = Expr("model", None)


@dataclasses.dataclass(frozen=True)
class Device(Expr):
    """The device type the objects are built for; the code refers to it as ``device``."""

    auto: bool = False

    @property
    def line(self) -> str:
        if self.auto:
            return 'device = "cuda" if torch.cuda.is_available() else "cpu"'
        return f"device = {self.value!r}"


def device(where: str) -> Device:
    """The device the training runs on: named, it need not be this machine's (torch is not
    imported); "auto" asks torch whether this machine has CUDA."""
    if where == "auto":
        return Device("device", resolve_device("auto").type, auto=True)
    return Device("device", device_type(where))


@dataclasses.dataclass
class Parts:
    """What a framework's writer says of a config: the objects (``spec``, named ``name`` in
    the code where they are one dict of keyword arguments), the calls that change the model,
    and the comment lines."""

    spec: dict[str, Any]
    name: str | None = None
    uses_device: bool = True
    usage: list[str] = dataclasses.field(default_factory=list)
    lost: list[str] = dataclasses.field(default_factory=list)
    differ: list[str] = dataclasses.field(default_factory=list)
    #: Calls on the model (:data:`MODEL` among their arguments), in order: ``Export.prepare``.
    model_calls: list[Call] = dataclasses.field(default_factory=list)


def build(value: Any, model: Any = None) -> Any:
    """The object ``value`` describes; :data:`MODEL` is ``model``."""
    if isinstance(value, Call):
        factory = _lookup(value.target)
        args = [build(a, model) for a in value.args]
        return factory(*args, **{k: build(v, model) for k, v in value.kwargs.items()})
    if isinstance(value, Name):
        return _lookup(value.target)
    if value is MODEL:
        return model
    if isinstance(value, Expr):
        return value.value
    if isinstance(value, Source):
        return value.value
    if isinstance(value, Named):
        return build(value.value, model)
    if isinstance(value, list):
        return [build(v, model) for v in value]
    if isinstance(value, dict):
        return {k: build(v, model) for k, v in value.items()}
    return value


def _lookup(target: str) -> Any:
    module, _, name = target.partition(":")
    try:
        found = importlib.import_module(module)
    except ImportError as exc:
        if importlib.util.find_spec(module.split(".")[0]) is not None:
            raise UsageError(
                f"{module} does not import here ({exc}): install what it needs to build its "
                "objects (the code text needs none)"
            ) from None
        raise UsageError(
            f"{module} is not installed: install the framework to build its "
            "objects (the code text needs none)"
        ) from None
    return functools.reduce(getattr, name.split("."), found)


def render(value: Any, imports: set[str]) -> str:
    """The code for ``value``, adding the imports it needs to ``imports``."""
    if isinstance(value, Call):
        args = [render(a, imports) for a in value.args]
        args += [f"{k}={render(v, imports)}" for k, v in value.kwargs.items()]
        return f"{_imported(value.target, imports)}({', '.join(args)})"
    if isinstance(value, Name):
        module, _, name = value.target.partition(":")
        imports.add(f"import {module}")
        return f"{module}.{name}"
    if isinstance(value, Expr):
        return value.code
    if isinstance(value, Named):
        return value.name
    if isinstance(value, list):
        return "[" + ", ".join(render(v, imports) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {render(v, imports)}" for k, v in value.items()) + "}"
    return repr(value)


def _imported(target: str, imports: set[str]) -> str:
    module, _, name = target.partition(":")
    if module.split(".")[0] in _WHOLE:
        imports.add(f"import {module.split('.')[0]}")
        return f"{module}.{name}"
    imports.add(f"from {module} import {name.split('.')[0]}")
    return name


def definitions(values: Any, imports: set[str]) -> list[str]:
    """The lines that define each :class:`Named` value inside ``values`` (a spec, a list of
    calls), once each, in the order they are met, inner ones first."""
    lines: list[str] = []
    seen: set[str] = set()

    def visit(value: Any) -> None:
        if isinstance(value, Named):
            if value.name in seen:
                return
            visit(value.value)
            seen.add(value.name)
            if isinstance(value.value, Source):
                imports.update(value.value.imports)
                lines.extend(["", "", *value.value.lines, "", ""])
            else:
                lines.append(f"{value.name} = {render(value.value, imports)}")
        elif isinstance(value, Call):
            for inner in (*value.args, *value.kwargs.values()):
                visit(inner)
        elif isinstance(value, (list, tuple)):
            for inner in value:
                visit(inner)
        elif isinstance(value, dict):
            for inner in value.values():
                visit(inner)

    visit(values)
    return lines


def program(
    head: list[str],
    spec: Mapping[str, Any],
    *,
    name: str | None,
    device_line: str | None,
    model_calls: tuple[Call, ...],
    after: list[str],
    usage: tuple[str, ...],
) -> str:
    """The code of an export: ``head`` comments, the imports, ``device``, the values defined
    once (:class:`Named`), ``spec`` as names or as the dict ``name``, the calls on the model,
    ``after`` (code lines that name their imports in full) and the ``usage`` comments."""
    imports: set[str] = set()
    defined = definitions([spec, list(model_calls)], imports)
    body = []
    if name is None:
        body += [
            f"{key} = {render(value, imports)}"
            for key, value in spec.items()
            if not (isinstance(value, Named) and value.name == key)
        ]
    else:
        body.append(f"{name} = {{")
        body += [f"    {key!r}: {render(value, imports)}," for key, value in spec.items()]
        body.append("}")
    body += [render(call, imports) for call in model_calls]
    body += after
    if any(line.startswith("scalertune.") for line in after):
        imports.add("import scalertune")
    if device_line is not None:
        imports.add("import torch")
        defined.insert(0, device_line)
    lines = [*head, *_merged(imports), "", *defined, *body, *usage]
    return "\n".join(_one_blank_run(lines)) + "\n"


def _one_blank_run(lines: list[str]) -> list[str]:
    """``lines`` with no more than two blank lines in a row (a function's own spacing)."""
    kept: list[str] = []
    for line in lines:
        if not line and len(kept) >= 2 and not kept[-1] and not kept[-2]:
            continue
        kept.append(line)
    return kept


def _merged(imports: set[str]) -> list[str]:
    """The import lines, ``import`` ones first, one ``from`` line per module."""
    names: dict[str, list[str]] = {}
    for line in sorted(i for i in imports if i.startswith("from ")):
        module, _, name = line[len("from ") :].partition(" import ")
        names.setdefault(module, []).append(name)
    whole = sorted(i for i in imports if not i.startswith("from "))
    return whole + [f"from {m} import {', '.join(sorted(n))}" for m, n in sorted(names.items())]
