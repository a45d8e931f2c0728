"""Runs as a study stores them, for the tests of what is judged from them."""

from scalertune._amp._config import AmpConfig
from scalertune._judge._outcome import Figures, Outcome


def sampled(number, config=None, *, state="complete", duplicate_of=None, **figures):
    """A sampled search run of ``config`` (PyTorch's defaults where none) with the
    :class:`~scalertune._judge._outcome.Figures` ``figures``, and no loss curve."""
    return Outcome(
        number=number,
        role="search",
        config=config or AmpConfig(),
        seed=0,
        state=state,
        figures=Figures(**figures),
        duplicate_of=duplicate_of,
        losses=(),
    )
