"""analyze(): a search's result rebuilt from the study alone, with the ways to show it.

What the study shows, and the answer, are the judge's (:func:`~scalertune._judge._answer.
judge`); the review adds the real runs that loaded the answer and checked themselves.
"""

from __future__ import annotations

import optuna

from scalertune._judge._answer import judge
from scalertune._review._result import SearchResult
from scalertune._review._runs import real_runs


def analyze(study: optuna.Study, *, storage: str = "") -> SearchResult:
    """Rebuild the result of a search from its study alone, without training anything.

    What ``scalertune report`` and the dashboard's notes show; any worker, or a later
    session, can ask a study for its answer this way.

    Args:
        study: The Optuna study a search wrote (``optuna.load_study(study_name=...,
            storage=...)``).
        storage: The storage URL to record in the result (its password hidden); ``""`` for
            none.

    Returns:
        The :class:`SearchResult`, as :func:`search` returned it (or as far as the study got).

    Raises:
        UsageError: The study's settings were written by a newer scalertune than this one.

    Example:
        >>> import optuna, scalertune
        >>> study = optuna.load_study(study_name="classifier:make_model",
        ...                           storage="sqlite:///scalertune.db")  # doctest: +SKIP
        >>> result = scalertune.analyze(study)  # doctest: +SKIP
        >>> result.config.describe()  # doctest: +SKIP
        'float16 scale=4096 growth=2 backoff=0.5 every 2000, no clip'
    """
    return SearchResult.of(judge(study, storage=storage), runs=real_runs(study.user_attrs))
