"""The pictures a search writes beside its YAML: the answer's run (or the best AMP config's,
where float32 is the answer on this device), PyTorch's defaults, and the horizon's.

``STEM.NAME.trial-N.png`` per run (:func:`~scalertune._review._plots.picture_path`) and
``STEM.horizon.png``; the study keeps the same files as artifacts
(:mod:`scalertune._review._artifacts`), which the dashboard's notes embed.
"""

from __future__ import annotations

import os

from scalertune._amp._config import DEFAULTS_BASELINES
from scalertune._judge._findings import Findings
from scalertune._review._horizon_plot import write_horizon_picture
from scalertune._review._plots import have_matplotlib, named_run, picture_path, plot_run


def write_pictures(result: Findings, next_to: str) -> dict[int, str]:
    """PNGs of the recommendation, PyTorch's defaults and the horizon beside ``next_to``.

    Returns trial number -> path (the horizon's under the float32 reference's number); empty
    when matplotlib is not installed.
    """
    if not have_matplotlib():
        return {}
    stem = os.path.splitext(next_to)[0]
    written = {}
    for name in ("recommended", *DEFAULTS_BASELINES):
        try:
            outcome = named_run(result, name)
        except KeyError:
            continue
        if outcome.number in written:  # the best AMP config is PyTorch's defaults: one picture
            continue
        # where float32 is the answer on this device, the picture is the best AMP config's
        shown = "best-amp" if name == "recommended" and result.recommended is None else name
        path = picture_path(stem, shown, outcome.number)
        plot_run(result, outcome, path)
        written[outcome.number] = path
    written.update(write_horizon_picture(result, stem))
    return written
