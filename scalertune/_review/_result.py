"""SearchResult: what a search found, and the ways to show it.

Like Lightning's learning-rate finder, a search returns an object, not a bare dict: the
config to use (:attr:`SearchResult.config`), the evidence behind it (the float32 reference,
the baselines, the ranking, the confirmation runs, the interleaved step timing) and ways to
show it (:meth:`SearchResult.summary`, :meth:`SearchResult.to_yaml`,
:meth:`SearchResult.plot`), and to ask it about other configs (:meth:`SearchResult.predict`).
The evidence is plain data (:class:`~scalertune._judge._findings.Findings`); each way to show
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
from scalertune._judge._findings import Findings
from scalertune._replay._predict import Prediction, predict, predict_deepspeed
from scalertune._review import _describe, _document, _pictures, _plots, _summary, _verdict


@dataclasses.dataclass(frozen=True)
class SearchResult(Findings):
    """What a search found: :attr:`config` to train with, and the evidence for it.

    Like Lightning's learning-rate finder, the result is an object, not a bare dict: the
    answer, the runs behind it (the float32 reference, the baselines, the ranking, the
    confirmations, the step timing; the fields below) and ways to show it.
    :func:`scalertune.search` returns one and :func:`scalertune.analyze` rebuilds one from a
    study alone: it is not built by hand.

    Example:
        >>> import scalertune
        >>> result = scalertune.search("examples/classifier.py:make_model")  # doctest: +SKIP
        >>> print(result.summary())  # doctest: +SKIP
        >>> result.to_yaml("amp.yaml")  # doctest: +SKIP
        >>> amp = scalertune.load("amp.yaml", device="cuda")  # doctest: +SKIP
    """

    @classmethod
    def of(cls, found: Findings, **changes: Any) -> SearchResult:
        """The findings ``found``, with the ways to show them.

        Args:
            found: What the judge found (:func:`~scalertune._judge._answer.judge`).
            **changes: Fields to set otherwise than ``found`` has them (the review adds
                ``runs``, the real runs that loaded the answer).

        Returns:
            The :class:`SearchResult` of the same evidence.
        """
        fields = {f.name: getattr(found, f.name) for f in dataclasses.fields(found)}
        return cls(**{**fields, **changes})

    @property
    def verdict(self) -> str:
        """The one-paragraph answer the summary, the YAML and the dashboard carry."""
        return _verdict.verdict(self)

    def summary(self, *, top: int = 5) -> str:
        """The table printed at the end of a search (and by ``scalertune report``).

        Args:
            top: How many ranked configs the table shows.

        Returns:
            The summary, several lines.

        Example:
            >>> result = scalertune.analyze(study)  # doctest: +SKIP
            >>> print(result.summary(top=3))  # doctest: +SKIP
        """
        return _summary.summary(self, top=top)

    def to_dict(self) -> dict[str, Any]:
        """The recommendation and its evidence as plain data (the YAML file's content).

        Returns:
            ``config``, ``guard`` and ``evidence``, in plain types.

        Example:
            >>> result.to_dict()["config"]  # doctest: +SKIP
            {'dtype': 'float16', 'init_scale': 4096.0, 'growth_factor': 2.0, ...}
        """
        return _document.document(self)

    def to_yaml(self, path: str) -> None:
        """Write the recommendation and its evidence to ``path``; :func:`scalertune.load` reads it.

        The file is written atomically, with a header saying how to load it.

        Args:
            path: Where to write the YAML.

        Example:
            >>> result.to_yaml("amp.yaml")  # doctest: +SKIP
            >>> amp = scalertune.load("amp.yaml", device="cuda")  # doctest: +SKIP
        """
        write_result(self.to_dict(), path)

    def guard(self) -> Guard | None:
        """The production guard the evidence supports.

        For the answer, or for the best AMP config when float32 is the answer on this device.

        Returns:
            The :class:`Guard`, or ``None`` where no config with a scaler holds.

        Example:
            >>> result.guard()  # doctest: +SKIP
            Guard(min_scale=1.0, max_consecutive_skips=25, check_every=100)
        """
        return _document.guard(self, self.recommended or self.best_amp)

    def plot(self, path: str, *, run: str = "recommended") -> None:
        """Write a PNG of one run: its loss over float32's and its loss scale, step by step.

        Args:
            path: Where to write the PNG.
            run: ``"recommended"`` (the answer, or the best AMP config where float32 is the
                answer), a baseline's name (``"pytorch-default"``, ``"init-scale-4096"``), or
                ``"#N"`` for trial ``N``.

        Raises:
            UsageError: matplotlib is not installed (``pip install 'scalertune[dashboard]'``).
            KeyError: No run is called ``run``.

        Example:
            >>> result.plot("recommended.png")  # doctest: +SKIP
            >>> result.plot("default.png", run="pytorch-default")  # doctest: +SKIP
        """
        _plots.plot(self, path, run=run)

    def write_pictures(self, next_to: str) -> dict[int, str]:
        """Write PNGs of the recommendation, PyTorch's defaults and the horizon beside ``next_to``.

        Args:
            next_to: A file whose name (without its extension) the pictures' names start with.

        Returns:
            Trial number -> path of its picture; empty when matplotlib is not installed.

        Example:
            >>> result.write_pictures("amp.yaml")  # doctest: +SKIP
            {12: 'amp.trial-12.png', 0: 'amp.pytorch-default.png'}
        """
        return _pictures.write_pictures(self, next_to)

    def forecast(self) -> str | None:
        """Beyond the horizon: when the first module's forward peaks would reach float16's range.

        Returns:
            A line naming the module whose forward peaks, at their trend, would reach float16's
            range first, and when; ``None`` where no trend is significant.

        Example:
            >>> result.forecast()  # doctest: +SKIP
        """
        return _describe.forecast_line(self)

    def forward_overflow_hint(self) -> str | None:
        """What to do when every float16 trial overflowed in the forward pass.

        Returns:
            The hint (keep the named modules in float32, or train in bfloat16), or ``None`` where
            some float16 trial kept its forward finite.

        Example:
            >>> result.forward_overflow_hint()  # doctest: +SKIP
        """
        return _describe.overflow_hint(self)

    def predict(
        self, config: AmpConfig | Mapping[str, Any], *, horizon: int | None = None
    ) -> Prediction:
        """What ``config``'s loss scaler will do over the horizon, replayed from the trace.

        The float32 reference's gradients were recorded at every step; the scaler's update rule
        is replayed over them, exactly as GradScaler (or DeepSpeed's scaler, for an ``fp16``
        block) applies it, without training.

        Args:
            config: The config to replay: an :class:`AmpConfig` (GradScaler's knobs), or a
                DeepSpeed ``fp16`` block as ``ds_config.json`` holds it (a dict; a whole
                DeepSpeed config is read for its ``fp16`` block), replayed under DeepSpeed's
                own scaler, with its hysteresis and its floor, as ZeRO runs it.
            horizon: How many steps of the horizon to replay; ``None`` for all of it.

        Returns:
            A prediction: its ``skipped_steps``, and where; its ``min_scale`` and
            ``final_scale``; the share of gradient values that flush to zero, per tenth of the
            horizon; for an ``fp16`` block, ``stops_at``, where DeepSpeed would raise at its
            floor and end the training.

        Raises:
            UsageError: The study's float32 reference has no gradient trace (it ran before
                scalertune recorded one): rerun the search with a new study name.
            ParameterError: an ``fp16`` block that does not enable fp16, or one DeepSpeed
                would not scale with.

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
        """The same evidence with trial ``number``'s config as the answer (``report --trial``).

        Its YAML loads that config, and says it was chosen by hand.

        Args:
            number: A finished run of this study (a sampled trial or a baseline).

        Returns:
            A copy of this result with that run as the answer.

        Raises:
            ParameterError: ``number`` is not a finished run of this study.

        Example:
            >>> result.for_trial(7).to_yaml("trial7.yaml")  # doctest: +SKIP
        """
        chosen = next((o for o in [*self.ranking, *self.islands] if o.number == number), None)
        if chosen is None:
            raise ParameterError(
                "trial",
                f"must be a finished AMP run of this study (a row of the summary's table: a "
                f"sampled trial, a baseline, an island), got {number}",
            )
        twin = self.float32_clip  # float32 at the chosen run's own clip, where that ran
        if twin is not None and twin.config.clip_norm != chosen.config.clip_norm:
            twin = None
        return dataclasses.replace(
            self, recommended=chosen, best_amp=chosen, float32_clip=twin, by_hand=True
        )
