"""A Griffe extension: the package's docstrings, written for doctest and reST, read as Markdown.

The docstrings are Google style with a few reST habits. Before Griffe parses them:

- ``Example:`` becomes ``Examples:``, the section whose ``>>>`` lines Griffe renders as code
  (a bare ``Example:`` would be an admonition, and its ``>>>`` lines quoted text);
- a role (``:class:`AmpGuardError```, ``:meth:`prepare```) becomes inline code, linked to
  the API page's entry when it names a public name of ``scalertune``;
- a paragraph ending in ``::`` (reST's literal block) ends in ``:``: the indented block after
  it is a code block in Markdown too.

Nothing is changed in the package: only what the site shows.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|data|exc|mod|obj):`~?([^`]+)`")
_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.M)
_LITERAL = re.compile(r"(\S)::$", re.M)


def _public() -> frozenset[str]:
    import scalertune

    return frozenset(scalertune.__all__)


class ReadAsMarkdown(griffe.Extension):
    def __init__(self) -> None:
        super().__init__()
        self.public = _public()

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = self.markdown(obj.docstring.value)

    def markdown(self, text: str) -> str:
        text = _EXAMPLE.sub(r"\1Examples:", text)
        text = _LITERAL.sub(r"\1:", text)
        return _ROLE.sub(self._role, text)

    def _role(self, match: re.Match[str]) -> str:
        target = match.group(1)
        name = target.removeprefix("scalertune.")
        if name in self.public:
            return f"[`{name}`][scalertune.{name}]"
        return f"`{target}`"
