"""The command line: its parser, its commands, and its names for the API's parameters.

- ``_parser``: the parser of every command, and its one-line usage errors;
- ``_help``: the text of ``--help``;
- ``_flags``: the flag of each Python parameter, and the number checks before torch loads;
- ``_files``: what the command line checks of the files it is given;
- ``_commands``: the commands themselves, on top of the Python API.
"""

from scalertune._cli._commands import COMMANDS, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_STORAGE
from scalertune._cli._flags import flag
from scalertune._cli._parser import EXIT_USAGE, build, parse

__all__ = [
    "COMMANDS",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_STORAGE",
    "EXIT_USAGE",
    "build",
    "flag",
    "parse",
]
