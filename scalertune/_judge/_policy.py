"""The judge's policy numbers, each with the reason for its value: when the float32 reference
says anything, when a study has stopped making progress, and the floor of a tie.

Numbers that more than one stage reads are in ``scalertune._policy``.
"""

#: A float32 reference must lower its smoothed loss by at least this share of where it
#: started, and by more than ``REFERENCE_NOISE_MULTIPLE`` standard errors of its final
#: smoothed loss (the standard deviation of the per-step losses over its last
#: ``SMOOTHING_STEPS`` steps, over the square root of that count): batch-to-batch noise.
#: It must also end more than ``TARGET_TOLERANCE`` below its start, so that the target lies
#: below where every run begins. Below that the target says nothing (every run "reaches" it
#: at once, one that skipped every step included) and the search stops before any trial
#: runs. 1% is far below what any training that learns does in a search's budget of steps;
#: twice the noise keeps a flat, noisy loss from passing as learning. The same two numbers say
#: where float32 has *settled*: past the step from which it falls no further than this (of its
#: final loss), a run that reached the target has seen everything float32's last steps show;
#: before it, the run trains on (:attr:`~scalertune._judge._target.Target.settled_step`).
REFERENCE_MIN_DROP = 0.01
REFERENCE_NOISE_MULTIPLE = 2.0

#: A sampled config identical to one the study has finished is not trained again: its result
#: is reused. This many reused ones in a row mean the sampler has nothing new to propose
#: (a small or purely categorical space), and the search stops.
MAX_CONSECUTIVE_DUPLICATES = 10

#: Two runs of one dtype tie when their steps to the target differ by less than float32's own
#: seed-to-seed spread (its steps to its target on the search's three seeds), and a tie goes to
#: the simpler config. The spread of three seeds can come out near zero by chance (every run
#: of the classifier reaches its target at step 176-177); 2% keeps a difference of a few steps
#: from deciding: below the target's own tolerance, and below what a rerun moves.
SEED_SPREAD_FLOOR = 0.02

#: The study stops early when this many sampled trials in a row (reused duplicates not
#: counted) have not found a faster time to target, once ``STUDY_MIN_TRIALS`` have run: 4 in a
#: row without progress after at least 6 leave the answer unchanged on the shipped examples.
STUDY_PATIENCE = 4
