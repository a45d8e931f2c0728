"""The replay's policy numbers, each with the reason for its value: when the forecast past the
horizon names a trend, and how far it reaches.

Numbers that more than one stage reads are in ``scalertune._policy``.
"""

#: The forecast beyond the horizon fits a module's forward peaks over the second half of the
#: horizon, as a power of the step, only when it has at least ``FORECAST_MIN_BLOCKS`` blocks
#: of them, and names a trend only when its exponent is ``FORECAST_T`` standard errors above
#: zero: a peak that merely wanders must not be extrapolated to an overflow.
FORECAST_MIN_BLOCKS = 10
FORECAST_T = 3.0

#: ... and only while it keeps to one power: the exponents over the earlier and the later half
#: of the fitted blocks must agree within this factor, so that an output levelling off within
#: the horizon (approaching the size of its targets) or speeding up is not extrapolated. A
#: factor of 2 is about what the halves of a steady trend differ by on the noisy peaks of the
#: models ``benchmarks/forecast.py`` measures.
FORECAST_STEADY = 2.0

#: ... and only as far as it was measured: ``benchmarks/forecast.py`` checks the fitted line
#: against real float32 runs to 10 times the horizon; a forecast further out is unchecked.
FORECAST_REACH = 10
