"""The launcher's policy number, with the reason for its value: how long the ranks of a failed
job have to report before they are all killed.

Numbers that more than one stage reads are in ``scalertune._policy``.
"""

#: After the first rank of a run fails, the launcher waits this long (seconds) for the others
#: to report or die before it kills them all: a rank that dies makes its peers fail in their
#: next collective within milliseconds, and the record must name the rank that died, not the
#: peer whose collective broke first.
RANK_SETTLE_S = 2.0
