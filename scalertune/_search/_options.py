"""The options of a search, each checked once: :func:`scalertune.search`'s keyword arguments
in one record (the command line builds it from its flags), and the :class:`Isolation` of its
runs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from scalertune import _limits

if TYPE_CHECKING:
    from scalertune._search._space import SearchSpace


@dataclasses.dataclass(frozen=True)
class Isolation:
    """Run each trial in its own process, bounded in time and memory.

    A trial that crashes the process, hangs or runs out of memory is then one failed trial,
    not a failed search (``--isolate`` on the command line).

    Args:
        timeout_s: Seconds a trial's process may run before it is killed; ``None`` for no
            bound.
        memory_gb: The address space a trial's process may take, in GiB; ``None`` for no
            bound.
        nproc_per_node: More than 1: each run in that many processes, the ranks of one
            ``torch.distributed`` group (what :func:`scalertune.search`'s ``nproc_per_node``
            sets).
        independent_ranks: The ranks train copies of their own on purpose (an ensemble):
            the search's first step does not refuse ranks whose weights differ after it
            (``--independent-ranks``).
        nnodes: The hosts a run spans, ``nproc_per_node`` ranks each: more than 1 only
            where the command line runs under the user's launcher (``torchrun --nnodes``,
            ``srun``), which started the ranks.
        hosts: Their names, in node order.

    Raises:
        ParameterError: A bound out of range (a ``UsageError``: the command line exits with
            status 2).

    Example:
        >>> import scalertune
        >>> scalertune.Isolation(timeout_s=600, memory_gb=8)
        Isolation(timeout_s=600, memory_gb=8, nproc_per_node=1, independent_ranks=False)
        >>> isolation = scalertune.Isolation(timeout_s=600)
        >>> result = scalertune.search("model.py:make_model", isolation=isolation)  # doctest: +SKIP
    """

    timeout_s: float | None = None
    memory_gb: float | None = None
    nproc_per_node: int = 1
    independent_ranks: bool = False
    #: Under the user's launcher (``torchrun --nnodes``, ``srun``): the hosts a run spans,
    #: ``nproc_per_node`` ranks each, and their names in node order.
    nnodes: int = dataclasses.field(default=1, repr=False)
    hosts: tuple[str, ...] = dataclasses.field(default=(), repr=False)

    def __post_init__(self) -> None:
        _limits.check(
            _limits.SEARCH,
            timeout_s=self.timeout_s,
            memory_gb=self.memory_gb,
            nproc_per_node=self.nproc_per_node,
        )


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """Every option of one search, as :func:`scalertune.search` documents each: what its
    keyword arguments pack once, what the command line builds from its flags of the same
    names, and what the search's steps read.

    Raises:
        ParameterError: A number out of range, named as the Python parameter (the command
            line has checked its flags before, and names those).
    """

    storage: str | None
    study_name: str | None
    space: str | SearchSpace
    fp32_modules: str | None
    n_trials: int
    steps: int
    horizon: int | None
    seed: int
    device: str | None
    timeout: float | None
    isolation: Isolation | None
    artifact_dir: str | None
    nproc_per_node: int | None
    wait_for_storage: float
    log: Callable[[str], None] | None
    progress: bool

    def __post_init__(self) -> None:
        """The numbers within their ranges, in the order of the fields; ``None``: not given."""
        _limits.check(
            _limits.SEARCH,
            **{
                f.name: getattr(self, f.name)
                for f in dataclasses.fields(self)
                if f.name in _limits.SEARCH
            },
        )
