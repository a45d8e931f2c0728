"""The ways a search's result is shown and kept: the summary, the pictures, the YAML and
its predictions, the hint after a forward overflow. A mixin of :class:`SearchResult`, which
holds the evidence and the answer; these only render them."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from scalertune._amp._config import AmpConfig
from scalertune._amp._guard import Guard
from scalertune._amp._schema import write_result
from scalertune._errors import ParameterError, UsageError
from scalertune._judge._outcome import Outcome
from scalertune._replay._forecast import forecast
from scalertune._replay._predict import Prediction, predict
from scalertune._review import _document
from scalertune._review._describe import forward_overflow_hint
from scalertune._review._scaler import trace_of

if TYPE_CHECKING:
    from scalertune._review._result import SearchResult


class ResultViews:
    """Showing a :class:`SearchResult` (see the module's docstring)."""

    @property
    def pruned_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for outcome in self.ranking:
            if outcome.state == "pruned":
                kind = outcome.prune_kind or "unknown"
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    @property
    def forward_overflow_modules(self) -> list[str] | None:
        """``None`` unless *every* float16 run was pruned for a forward overflow; then where
        each overflowed (its culprit modules, as patterns), most frequent first (empty if
        none was named)."""
        runs = [o for o in self.ranking if o.config.dtype == "float16"]
        if not runs or any(o.prune_kind != "forward" for o in runs):
            return None
        named = [o.attrs["overflow_module"] for o in runs if o.attrs.get("overflow_module")]
        return sorted(set(named), key=lambda m: -named.count(m))

    def forward_overflow_hint(self) -> str | None:
        """What to do when every float16 trial overflowed in the forward pass."""
        if self.forward_overflow_modules is None:
            return None
        runs = [o.attrs for o in self.ranking if o.config.dtype == "float16"]
        return forward_overflow_hint(self.settings.get("factory", "FACTORY"), self.study_name,
                                     runs, space=self.settings.get("space", {}).get("name"))

    def predict(self, config: AmpConfig, *, horizon: int | None = None) -> Prediction:
        """What ``config``'s GradScaler will do over the horizon (or ``horizon`` steps of it),
        replayed from the float32 reference's gradient trace: its ``skipped_steps``, and
        where; its ``min_scale`` and ``final_scale``; the share of gradient values that flush
        to zero, per tenth of it.

        Example:
            >>> result = scalertune.analyze(study)  # doctest: +SKIP
            >>> result.predict(scalertune.AmpConfig()).skipped_steps  # doctest: +SKIP
            64
        """
        trace = trace_of(self)
        if trace is None:
            raise UsageError("this study's float32 reference has no gradient trace (it ran "
                             "before scalertune recorded one): rerun the search with a new "
                             "study name")
        return predict(trace, config, horizon=horizon or self.horizon)

    def forecast(self) -> str | None:
        """Beyond the horizon: the first module whose forward peaks, at their trend, would
        reach float16's range, and when; ``None`` where no trend is significant."""
        trace = trace_of(self)
        found = forecast(trace, self.horizon) if trace is not None else []
        return f"Forecast beyond the horizon: {found[0].describe()}" if found else None

    def summary(self, *, top: int = 5) -> str:
        """The table printed at the end of a search (and by ``scalertune report``)."""
        from scalertune._review._summary import render

        return render(self, top=top)

    def plot(self, path: str, *, run: str = "recommended") -> None:
        """Write a PNG of ``run`` (``recommended``, a baseline's name, or ``#N``): its loss
        over float32's and its loss scale, step by step. Needs matplotlib."""
        from scalertune._review._plots import plot_run

        plot_run(self, self._run(run), path)

    def write_pictures(self, next_to: str) -> dict[int, str]:
        """PNGs of the recommendation, PyTorch's defaults and the horizon beside ``next_to``.

        Returns trial number -> path; empty when matplotlib is not installed.
        """
        from scalertune._review._horizon_plot import write_horizon_picture
        from scalertune._review._plots import have_matplotlib, picture_path, plot_run

        if not have_matplotlib():
            return {}
        stem = os.path.splitext(next_to)[0]
        written = {}
        for name in ("recommended", "pytorch-default"):
            try:
                outcome = self._run(name)
            except KeyError:
                continue
            if outcome.number in written:  # the best AMP config is PyTorch's defaults: one picture
                continue
            # where float32 is the answer on this device, the picture is the best AMP config's
            shown = "best-amp" if name == "recommended" and self.recommended is None else name
            path = picture_path(stem, shown, outcome.number)
            plot_run(self, outcome, path)
            written[outcome.number] = path
        written.update(write_horizon_picture(self, stem))
        return written

    def _run(self, name: str) -> Outcome:
        if name == "recommended":
            chosen = self.recommended or self.best_amp
            if chosen is None:
                raise KeyError("no AMP config held")
            return chosen
        if name.startswith("#"):
            return next(o for o in self.ranking if o.number == int(name[1:]))
        return self.baselines[name]

    def to_dict(self) -> dict[str, Any]:
        """The recommendation and its evidence as plain data (the YAML file's content)."""
        return _document.document(self)

    def guard(self) -> Guard | None:
        """The production guard the evidence supports for the answer, or for the best AMP
        config when float32 is the answer on this device (see :func:`_document.guard`)."""
        return _document.guard(self, self.recommended or self.best_amp)

    def to_yaml(self, path: str) -> None:
        """Write the recommendation; :func:`scalertune.load` reads it back."""
        write_result(self.to_dict(), path)

    def for_trial(self, number: int) -> "SearchResult":
        """The same evidence with trial ``number``'s config as the answer (``report --trial``):
        its YAML loads that config, and says it was chosen by hand."""
        chosen = next((o for o in [*self.ranking, *self.islands] if o.number == number), None)
        if chosen is None:
            raise ParameterError("trial", f"must be a finished run of this study, got {number}")
        return dataclasses.replace(self, recommended=chosen, best_amp=chosen)
