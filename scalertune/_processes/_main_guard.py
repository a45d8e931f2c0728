"""The ``if __name__ == "__main__":`` guard a script needs around a call that starts
processes.

A spawned process, and one forked from a server, imports the user's script anew as its
``__main__``: a script that calls a search from its top-level code outside the guard would
run that search again in every process it starts. It is refused twice over: in the search's
own process before any process starts (:func:`refuse_unguarded`, read from the script's
source), and in a started process as it imports the script (:func:`refuse_reentry`, for a
script whose source cannot be read), which the parent turns into the same line.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import sys
from typing import Any, TypeGuard

from scalertune._errors import UsageError

#: The status a process this package started exits with when, as it starts, the user's
#: script it imports again calls scalertune again.
REENTERED_STATUS = 86

#: The names of the processes this package starts: one process, and each rank's (with its
#: number after it).
NAMES = ("scalertune-trial", "scalertune-rank")


def refuse_reentry() -> None:
    """In a process this package started, a search called again as the user's
    script is imported anew: end the process at once with ``REENTERED_STATUS``, which the
    parent turns into one line saying to guard the call, instead of a nested search (or each
    rank refusing itself as run by a launcher)."""
    if multiprocessing.current_process().name.startswith(NAMES):
        os._exit(REENTERED_STATUS)


def refuse_unguarded() -> None:
    """Before a search starts processes: a script that calls it from its top-level code
    outside an ``if __name__ == "__main__":`` block would run it again in every process (each
    imports the script anew), so it is refused in one line now, before anything is written.
    Read from where the script's top-level code stands in its source; a script that cannot
    be read (an interactive session, a frozen program) is left to :func:`refuse_reentry`."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if main is None or not path or not str(path).endswith(".py") or spec_name.endswith(".__main__"):
        return  # (``python -m package`` runs package/__main__.py, which a process does not import)
    frame: Any = sys._getframe(1)  # noqa: SLF001 - the standard way to walk the stack
    while frame is not None and not (
        frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"
    ):
        frame = frame.f_back
    if frame is None:
        return
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return
    line = frame.f_lineno
    guards = [node for node in ast.walk(tree) if _is_main_guard(node)]
    if not any(node.lineno <= line <= (node.end_lineno or line) for node in guards):
        raise reentered(os.path.basename(path))


def _is_main_guard(node: ast.AST) -> TypeGuard[ast.If]:
    """``if __name__ == "__main__":`` (either way round)."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    sides = [node.test.left, *node.test.comparators]
    names = {n.id for n in sides if isinstance(n, ast.Name)}
    values = {n.value for n in sides if isinstance(n, ast.Constant)}
    return names == {"__name__"} and values == {"__main__"}


def reentered(script: str | None = None) -> UsageError:
    """The line for a ``script`` (the one running as ``__main__`` when not given) that
    calls scalertune outside the guard."""
    if script is None:
        main = sys.modules.get("__main__")
        script = os.path.basename(getattr(main, "__file__", None) or "your script")
    return UsageError(
        f'{script} calls scalertune outside an if __name__ == "__main__": block, and each '
        "process the search starts (--isolate, --nproc-per-node) imports the script again "
        "and would run it again: put the call under that block"
    )
