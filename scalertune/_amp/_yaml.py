"""Reading the YAML a user hands over (a search space, a result file), with bounds.

``yaml.safe_load`` builds only plain types, but it trusts the file's size and shape: aliases
let a few hundred bytes stand for billions of values (the "billion laughs"), which any later
``str()`` or JSON dump expands, and deep nesting overflows the parser's stack. So a file is
read only up to ``MAX_YAML_BYTES``, its node graph is measured before any value is built (at
most ``MAX_YAML_VALUES`` values once aliases are expanded, no alias that contains itself),
and every number in it must be finite: nothing scalertune reads means NaN or infinity.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

from scalertune._amp import _policy as _amp_policy
from scalertune._amp._regular import Refused, read_regular
from scalertune._errors import UsageError
from scalertune._text import cut

_FLOAT_TAG = "tag:yaml.org,2002:float"
_INT_TAG = "tag:yaml.org,2002:int"
#: The most characters a number of a scalertune file is written in: a float's repr takes at
#: most 24, and an integer knob (a step count, a seed) fewer.
_NUMBER_CHARS = 100


def read_yaml(path: str, *, what: str, missing: str = "") -> Any:
    """The data in the YAML file ``path``; :class:`UsageError` naming ``what`` it should be
    when it cannot be read (``missing`` is appended to the message for a missing file)."""
    return parse_yaml(read_text(path, what=what, missing=missing), where=path)


def read_text(path: str, *, what: str, missing: str = "") -> str:
    """The text of the file ``path``, read as :func:`read_yaml` reads it (a regular file, up
    to ``MAX_YAML_BYTES``, UTF-8), not yet parsed."""
    try:
        raw = read_regular(path, _amp_policy.MAX_YAML_BYTES)
    except Refused as exc:
        if exc.kind == Refused.FOLDER:
            raise UsageError(f"{path} is a folder, not {what}") from None
        if exc.kind == Refused.LARGE:
            raise UsageError(
                f"{path} is larger than {_amp_policy.MAX_YAML_BYTES // 1024} KiB: is it {what}?"
            ) from None
        raise UsageError(f"{path} is not a regular file: is it {what}?") from None
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}{missing}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text: is it {what}?") from None


def parse_yaml(text: str, *, where: str) -> Any:
    """The data in YAML ``text``, bounded as the module says; ``where`` names it in errors."""
    loader = None
    try:
        # a NUL or control byte is refused as the loader reads the text: inside the ``try``
        loader = yaml.SafeLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node, where, loader)
        return loader.construct_document(node)
    except yaml.constructor.ConstructorError as exc:  # a tag safe YAML does not construct
        mark = exc.problem_mark
        at = f" at line {mark.line + 1}" if mark else ""
        tag = f" ({cut(str(exc.problem).rpartition(' ')[2], 80)})" if exc.problem else ""
        raise UsageError(
            f"{where} holds a tag{tag}{at} that is never read: a scalertune file is plain "
            "data (mappings, lists, numbers, text); fix the file"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(f"{where} is not valid YAML{at}: fix the file") from None
    except RecursionError:
        raise UsageError(f"{where} nests its values too deeply to be a scalertune file") from None
    except ValueError:  # an integer past Python's 4300 digits for int(str)
        raise UsageError(f"{where} holds a number too long to be a scalertune value") from None
    finally:
        if loader is not None:
            loader.dispose()


def _measure(root: yaml.Node, where: str, loader: yaml.SafeLoader) -> None:
    """Count the values ``root`` stands for with aliases expanded; refuse too many, an alias
    inside itself, and a number that is too long or not finite."""
    counted: dict[int, int] = {}
    open_nodes: set[int] = set()

    def count(node: yaml.Node) -> int:
        key = id(node)
        if key in counted:
            return counted[key]
        if key in open_nodes:
            raise UsageError(
                f"{where}: an alias at line {node.start_mark.line + 1} refers to "
                "a value that contains it: write the value out"
            )
        if isinstance(node, yaml.ScalarNode):
            _check_number(node, where, loader)
            total = 1
        else:
            open_nodes.add(key)
            if isinstance(node, yaml.MappingNode):
                _refuse_twice(node, where)
            children = (
                node.value
                if isinstance(node, yaml.SequenceNode)
                else [n for pair in node.value for n in pair]
            )
            total = 1 + sum(count(child) for child in children)
            open_nodes.discard(key)
        if total > _amp_policy.MAX_YAML_VALUES:
            raise UsageError(
                f"{where}: its aliases expand to more than "
                f"{_amp_policy.MAX_YAML_VALUES} values: write the values out"
            )
        counted[key] = total
        return total

    count(root)


def _refuse_twice(node: yaml.MappingNode, where: str) -> None:
    """A key written twice in one mapping: YAML's loader keeps the last without a word, and
    the first (a whole ``config:`` block) is silently not what is read."""
    seen: set[tuple[str, str]] = set()
    for key, _ in node.value:
        if isinstance(key, yaml.ScalarNode):
            if (key.tag, key.value) in seen:
                raise UsageError(
                    f"{where}: line {key.start_mark.line + 1}: the key {key.value!r} is "
                    "written twice in one mapping: keep one"
                )
            seen.add((key.tag, key.value))


def _check_number(node: yaml.ScalarNode, where: str, loader: yaml.SafeLoader) -> None:
    """Refuse a number written longer than any scalertune value, or not finite."""
    if node.tag in (_FLOAT_TAG, _INT_TAG) and len(node.value) > _NUMBER_CHARS:
        # a hexadecimal or binary integer has no digit limit as Python reads it, but one
        # written out in decimal (an error naming it) has: refused before it is read
        raise UsageError(
            f"{where}: line {node.start_mark.line + 1}: holds a number too long to be a "
            f"scalertune value ({len(node.value):,} characters): fix the file"
        )
    if node.tag != _FLOAT_TAG:
        return
    value = loader.construct_yaml_float(node)
    if not math.isfinite(value):
        raise UsageError(
            f"{where}: line {node.start_mark.line + 1}: {node.value} is not a "
            "finite number: give a finite value"
        )
