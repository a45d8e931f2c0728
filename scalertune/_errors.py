"""The exceptions that say whose fault a failure is: the input's, or the workload's."""


class UsageError(Exception):
    """Bad input: a missing file, a factory that returns the wrong thing, an invalid space.

    The message is one line that names the problem and what to do about it. The command line
    prints it and exits with status 2; the Python API lets it propagate. It is raised before
    any study row is written, so a bad invocation never leaves a half-written study behind.
    """


class ParameterError(UsageError, ValueError):
    """A number or option outside what it may be, named by its Python parameter.

    ``parameter`` is the name the Python API takes (``n_trials``); the command line says the
    same with its flag (``--n-trials``). ``problem`` is the rest of the sentence.

    Example:
        >>> str(ParameterError("steps", "must be an integer from 20 to 1000000, got 5"))
        'steps must be an integer from 20 to 1000000, got 5'
    """

    def __init__(self, parameter: str, problem: str) -> None:
        self.parameter, self.problem = parameter, problem
        super().__init__(f"{parameter} {problem}")


class SearchError(Exception):
    """The search cannot go on: the workload itself is broken (not one config)."""


class StorageUnavailable(Exception):
    """The study's storage or artifact store stayed unreachable past the outage bound
    (``_storage._policy.STORAGE_OUTAGE_S``): the search stopped where it was, nothing lost.
    Rerun the same command once the storage is back: the study resumes. Also an output file
    (the YAML, a picture) that cannot be written at the end (a full disk): the study keeps
    everything, ``report -o`` writes it again. The command line exits with status 3."""


class MissingEvidence(Exception):
    """Evidence a run needs could not be had: a checkpoint missing, damaged or unreadable, an
    artifact store or storage that failed. A fault outside the config: the run is retried or
    reported as missing, never judged."""


class DamagedEvidence(MissingEvidence):
    """A value read back from a study or its artifact store that is not what scalertune
    wrote there: another type or shape, a blob that does not decode, more than such a value
    can hold. Nothing in it is trusted: it is named in one line and handled as missing
    evidence (computed again, run again, or left out and said), never a crash and never a
    verdict."""


class DamagedCheckpoint(DamagedEvidence):
    """A checkpoint file that is not what a scalertune checkpoint holds: another format, a
    pickle that asks for anything but tensors and plain data, another model's keys or shapes,
    a state that does not load. It is read as damaged evidence (an earlier checkpoint, or step
    0), and nothing in it runs."""


class ExitCalled(SystemExit):
    """``os._exit(code)``, called by the user's code in the search's own process, raised in
    its place (:func:`scalertune._workload._factory.exits_raised`): there it would end the
    search at once, with the status it was given (0: a finished search) and nothing written,
    since no handler runs after it. Handled as ``sys.exit()``: a failed run, or, in the
    factory's first call, one line."""
