"""``scalertune diagnose``'s policy numbers, each with the reason for its value: the largest
scale it suggests, how many probes it spends, and how far it replays to locate an overflow.

Numbers that more than one stage reads are in ``scalertune._policy``.
"""

#: The largest loss scale ``diagnose`` suggests: the top of the shipped float16 space's
#: init_scale range. (Its smallest is ``SCALE_FLOOR``: below it a search prunes the run.)
DIAGNOSE_MAX_SCALE = 2.0**24

#: Real float16 runs ``diagnose`` spends finding a scale that does not skip (or flush): a
#: bisection over the 48 powers of two between the floors settles in 6; 8 leaves room for a
#: first guess, taken from the float32 gradient sizes, that misses.
DIAGNOSE_MAX_PROBES = 8

#: A search names the module of a forward overflow by replaying the pruned trial up to its
#: first non-finite step, at most this many steps: a later overflow costs more replay than a
#: hint is worth, and ``scalertune diagnose`` finds it.
LOCATE_MAX_STEPS = 50
