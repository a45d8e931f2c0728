"""SearchResult: what a search found, and the ways to show it.

Like Lightning's learning-rate finder, a search returns an object, not a bare dict: the
config to use (:attr:`SearchResult.config`), the evidence behind it (the float32 reference,
the baselines, the ranking, the confirmation runs, the interleaved step timing) and ways to
show it (:meth:`SearchResult.summary`, :meth:`SearchResult.to_yaml`,
:meth:`SearchResult.plot`), and to ask it about other configs (:meth:`SearchResult.predict`).
The evidence is plain data (:class:`~scalertune._review._findings.Findings`); each way to show
it is a function of that data in a module of its own, which the methods here call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from scalertune._amp._config import AmpConfig
from scalertune._amp._guard import Guard
from scalertune._amp._schema import write_result
from scalertune._errors import ParameterError, UsageError
from scalertune._replay._predict import Prediction, predict, predict_deepspeed
from scalertune._review import _describe, _document, _pictures, _plots, _summary, _verdict
from scalertune._review._findings import Findings


@dataclasses.dataclass(frozen=True)
class SearchResult(Findings):
    """What a search found: :attr:`config` to train with, and the evidence for it.

    Example:
        >>> import scalertune
        >>> result = scalertune.search("examples/classifier.py:make_model")  # doctest: +SKIP
        >>> print(result.summary())  # doctest: +SKIP
        >>> result.to_yaml("amp.yaml")  # doctest: +SKIP
        >>> amp = scalertune.load("amp.yaml", device="cuda")  # doctest: +SKIP
    """

    @property
    def verdict(self) -> str:
        """The one-paragraph answer the summary, the YAML and the dashboard carry."""
        return _verdict.verdict(self)

    def summary(self, *, top: int = 5) -> str:
        """The table printed at the end of a search (and by ``scalertune report``)."""
        return _summary.summary(self, top=top)

    def to_dict(self) -> dict[str, Any]:
        """The recommendation and its evidence as plain data (the YAML file's content)."""
        return _document.document(self)

    def to_yaml(self, path: str) -> None:
        """Write the recommendation; :func:`scalertune.load` reads it back."""
        write_result(self.to_dict(), path)

    def guard(self) -> Guard | None:
        """The production guard the evidence supports for the answer, or for the best AMP
        config when float32 is the answer on this device."""
        return _document.guard(self, self.recommended or self.best_amp)

    def plot(self, path: str, *, run: str = "recommended") -> None:
        """Write a PNG of ``run`` (``recommended``, a baseline's name, or ``#N``): its loss
        over float32's and its loss scale, step by step. Needs matplotlib."""
        _plots.plot(self, path, run=run)

    def write_pictures(self, next_to: str) -> dict[int, str]:
        """PNGs of the recommendation, PyTorch's defaults and the horizon beside ``next_to``.

        Returns trial number -> path; empty when matplotlib is not installed.
        """
        return _pictures.write_pictures(self, next_to)

    def forecast(self) -> str | None:
        """Beyond the horizon: the first module whose forward peaks, at their trend, would
        reach float16's range, and when; ``None`` where no trend is significant."""
        return _describe.forecast_line(self)

    def forward_overflow_hint(self) -> str | None:
        """What to do when every float16 trial overflowed in the forward pass."""
        return _describe.overflow_hint(self)

    def predict(
        self, config: AmpConfig | Mapping[str, Any], *, horizon: int | None = None
    ) -> Prediction:
        """What ``config``'s loss scaler will do over the horizon (or ``horizon`` steps of
        it), replayed from the float32 reference's gradient trace: its ``skipped_steps``, and
        where; its ``min_scale`` and ``final_scale``; the share of gradient values that flush
        to zero, per tenth of it.

        ``config`` is an :class:`AmpConfig` (GradScaler's knobs), or a DeepSpeed ``fp16``
        block as ``ds_config.json`` holds it (a dict; a whole DeepSpeed config is read for
        its ``fp16`` block): DeepSpeed's own scaler, with its hysteresis and its floor, as
        ZeRO runs it (``stops_at`` says where it would raise and end the training).

        Example:
            >>> result = scalertune.analyze(study)  # doctest: +SKIP
            >>> result.predict(scalertune.AmpConfig()).skipped_steps  # doctest: +SKIP
            64
            >>> block = {"enabled": True, "initial_scale_power": 12, "hysteresis": 2}
            >>> result.predict(block).skipped_steps  # doctest: +SKIP
            5
        """
        trace = self.trace
        if trace is None:
            raise UsageError(
                "this study's float32 reference has no gradient trace (it ran "
                "before scalertune recorded one): rerun the search with a new "
                "study name"
            )
        horizon = horizon or self.horizon
        if isinstance(config, Mapping):
            block = config.get("fp16", config)
            return predict_deepspeed(
                trace, block, horizon=horizon, zero=self.settings.zero or not self.deepspeed
            )
        return predict(trace, config, horizon=horizon, zero=self.settings.zero)

    def for_trial(self, number: int) -> SearchResult:
        """The same evidence with trial ``number``'s config as the answer (``report --trial``):
        its YAML loads that config, and says it was chosen by hand."""
        chosen = next((o for o in [*self.ranking, *self.islands] if o.number == number), None)
        if chosen is None:
            raise ParameterError("trial", f"must be a finished run of this study, got {number}")
        return dataclasses.replace(self, recommended=chosen, best_amp=chosen)
