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
    """Rebuild the result of a search from the study alone (no training runs)."""
    return SearchResult.of(judge(study, storage=storage), runs=real_runs(study.user_attrs))
