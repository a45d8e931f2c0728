"""The one exception type that means "the user's input is wrong"."""


class UsageError(Exception):
    """Bad input: a missing file, a factory that returns the wrong thing, an invalid space.

    The message is one line that names the problem and what to do about it. The command line
    prints it and exits with status 2; the Python API lets it propagate. It is raised before
    any study row is written, so a bad invocation never leaves a half-written study behind.
    """
