"""The command line: its parser, its commands, and its names for the API's parameters."""

from scalertune._cli._commands import COMMANDS, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_STORAGE
from scalertune._cli._flags import flag
from scalertune._cli._parser import EXIT_USAGE, build, parse

__all__ = ["COMMANDS", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_STORAGE", "EXIT_USAGE", "build",
           "flag", "parse"]
