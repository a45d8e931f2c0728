"""The review's policy numbers, each with the reason for its value: where the recommended
guard's floor sits.

Numbers that more than one stage reads are in ``scalertune._policy``.
"""

#: The production guard's floor sits this many powers of two below the smallest loss scale
#: the recommended config reached in the search (on any seed): far enough that a longer run's
#: ordinary back-offs never trip it, close enough to stop a collapse long before the floor of
#: a search (2**-24).
GUARD_SCALE_MARGIN_POWERS = 10
