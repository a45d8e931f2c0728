"""The ``scalertune`` command: a thin layer over :func:`scalertune.search` and friends.

:func:`main` runs one command line and returns its exit status; ``scalertune`` (the
executable) is :func:`program`. The parser, the commands and their file checks live in
:mod:`scalertune._cli`; errors from the Python API are translated here into the command
line's words (a parameter becomes its flag) and exit statuses.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from scalertune import _interrupt
from scalertune._cli import (
    COMMANDS,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_STORAGE,
    EXIT_USAGE,
    flag,
    parse,
)
from scalertune._errors import (
    ExitCalled,
    MissingEvidence,
    ParameterError,
    SearchError,
    StorageUnavailable,
    UsageError,
)
from scalertune._storage._outage import Outage

__all__ = ["EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_STORAGE", "EXIT_USAGE", "main", "program"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``scalertune`` command line; return its exit status.

    Example:
        >>> from scalertune.cli import main
        >>> main(["--version"])  # doctest: +SKIP
        scalertune 0.1.0
        0
    """
    return _main(argv, exiting=False)


def program() -> NoReturn:
    """The ``scalertune`` executable: exit with the status of the command line. A Ctrl-C or
    SIGTERM that arrives once the command is done cannot change that status. Output piped
    into a reader that stops early (``| head``) ends the command quietly, as a shell tool
    does (status 1 where output was lost): what a search had finished is in its storage."""
    try:
        code = _main(None, exiting=True)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python's own advice: point stdout at nothing, so the flush at exit fails no more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    sys.exit(code)


def _main(argv: Sequence[str] | None, *, exiting: bool) -> int:
    with _interrupt.handled():
        try:
            with _interrupt.imports():  # the parser imports the export's module
                args = parse(argv)
            code = args if isinstance(args, int) else _run(args.command, args)
        except KeyboardInterrupt:  # before a search opened its study, or outside a search
            print("scalertune: interrupted", file=sys.stderr)
            code = EXIT_INTERRUPTED
        if exiting:
            _interrupt.settle()
        return code


def _run(command: str, args: argparse.Namespace) -> int:
    from scalertune._cli._commands import CLOSING

    code = EXIT_FAILED
    try:
        code = _outcome(command, args)
        return code
    finally:
        while CLOSING:  # under the user's launcher: the other ranks end with this status
            CLOSING.pop()(code)


def _outcome(command: str, args: argparse.Namespace) -> int:
    try:
        return COMMANDS[command](args)
    except ParameterError as exc:
        print(
            f"scalertune {command}: error: {flag(exc.parameter)} {exc.problem}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    except UsageError as exc:
        print(f"scalertune {command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SearchError as exc:  # the workload itself is broken
        print(f"scalertune {command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (StorageUnavailable, Outage, MissingEvidence) as exc:  # nothing lost: rerun
        print(f"scalertune {command}: {exc}", file=sys.stderr)
        return EXIT_STORAGE
    except SystemExit as exc:  # the user's module or step called sys.exit() outside a run
        how = "os._exit" if isinstance(exc, ExitCalled) else "sys.exit"
        print(
            f"scalertune {command}: error: the workload called {how}({exc.code!r}): "
            "return from the factory instead, and keep script code under "
            "if __name__ == '__main__':",
            file=sys.stderr,
        )
        return EXIT_USAGE


if __name__ == "__main__":
    program()
