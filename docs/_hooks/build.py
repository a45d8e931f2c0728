"""MkDocs hooks: what the site builds from the code instead of keeping a copy of it.

- The command-line reference (``reference/cli.md``) gets every command's ``--help``, from
  the parser itself (``scalertune._cli.build()``), where the page says
  ``<!-- scalertune-cli-help -->``. The help text is never committed: a changed option shows
  on the next build.
- The API reference (``reference/api.md``) must document every name in
  ``scalertune.__all__``; a public name without its ``::: scalertune.NAME`` fails the build.
- The pictures live once, in ``examples/``. Pages link them as GitHub sees them
  (``../../examples/dashboard.png`` from ``docs/guides/``); the site serves them from
  ``examples/`` beside its pages, and the links are rewritten to match.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from collections.abc import Iterator

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PICTURES = os.path.join(ROOT, "examples")
CLI_PAGE, CLI_MARKER = "reference/cli.md", "<!-- scalertune-cli-help -->"
API_PAGE = "reference/api.md"
#: The width the help text is formatted at: argparse reads it from COLUMNS.
HELP_COLUMNS = 100


def on_files(files: Files, config, **kwargs) -> Files:
    for name in sorted(os.listdir(PICTURES)):
        if name.endswith(".png"):
            files.append(
                File.generated(
                    config, f"examples/{name}", abs_src_path=os.path.join(PICTURES, name)
                )
            )
    return files


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    src = page.file.src_uri
    markdown = _picture_links(markdown, src)
    if src == CLI_PAGE:
        if CLI_MARKER not in markdown:
            raise PluginError(f"{CLI_PAGE} lost its marker {CLI_MARKER}")
        markdown = markdown.replace(CLI_MARKER, cli_help())
    if src == API_PAGE:
        _check_api(markdown)
    return markdown


def cli_help() -> str:
    """Every command's ``--help``, as the terminal prints it, one section each."""
    from scalertune._cli import build

    parser = build()
    sections = [("scalertune", parser)]
    for action in parser._subparsers._group_actions:  # noqa: SLF001 - argparse keeps them here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            sections += [(f"scalertune {name}", sub) for name, sub in action.choices.items()]
    out = []
    with _columns(HELP_COLUMNS):
        for title, p in sections:
            text = p.format_help().rstrip()
            if "```" in text:
                raise PluginError(f"the help of {title} holds ``` and would end its code block")
            out.append(
                f'## `{title}`\n\n<div class="cli-help" markdown>\n\n'
                f"```text\n{text}\n```\n\n</div>\n"
            )
    return "\n".join(out)


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def _check_api(markdown: str) -> None:
    import scalertune

    documented = set(re.findall(r"^::: scalertune\.(\w+)\s*$", markdown, flags=re.M))
    missing = [name for name in scalertune.__all__ if name not in documented]
    if missing:
        raise PluginError(
            f"{API_PAGE} does not document {', '.join(missing)} "
            "(add '::: scalertune.NAME' for each)"
        )


_PICTURE_LINK = re.compile(r"\]\(((?:\.\./)+)examples/([\w.-]+\.png)\)")


def _picture_links(markdown: str, src_uri: str) -> str:
    """``](../../examples/X.png)`` as GitHub resolves it from ``docs/guides/page.md`` becomes
    ``](../examples/X.png)``: the same file, where the site serves it."""
    depth = src_uri.count("/")

    def site_link(match: re.Match[str]) -> str:
        ups = match.group(1).count("../")
        if ups != depth + 1:  # not a link out of docs/ to the repository's examples/
            return match.group(0)
        return f"]({'../' * depth}examples/{match.group(2)})"

    return _PICTURE_LINK.sub(site_link, markdown)
