"""Every name a scalertune study stores, in one place: attribute keys and trial roles.

A study holds the settings it was made with, one trial per run, and a few study attributes
for the once-per-study work. What each trial is, is its ``role`` user attribute. Big or
exact figures go to system attributes (``scalertune.*``), which the dashboard's tables leave
out; rounded figures for reading go to user attributes, which it shows.
"""

#: Trial roles (the ``role`` user attribute).
ROLE_REFERENCE = "reference"  # the float32 run of a seed: the yardstick
ROLE_SEARCH = "search"  # a config the sampler chose
ROLE_BASELINE = "baseline"  # PyTorch's defaults and the seed article's fix
ROLE_CONFIRM = "confirm"  # a candidate rerun on another seed
ROLE_RECOMMENDED = "recommended"  # the answer, added last so that it is the best trial
#: float32 with the recommended config's clipping: what the clipping alone does.
ROLE_FLOAT32_CLIP = "float32-clip"
#: A trial that lost the race for the study's last sampled slot, and never ran.
ROLE_SURPLUS = "surplus"
#: Runs whose outcome the ranking reads.
RUN_ROLES = (ROLE_SEARCH, ROLE_BASELINE, ROLE_CONFIRM)

#: Study user attributes: the settings the study was created with, why sampling stopped, and
#: where its pictures are stored.
SETTINGS_ATTR = "scalertune.settings"
STOPPED_ATTR = "scalertune.stopped_early"
ARTIFACT_DIR_ATTR = "scalertune.artifact_dir"
#: Study system attributes holding claims on once-per-study work, by key.
CLAIM_PREFIX = "scalertune.claim."

#: Trial system attributes: a run's per-step loss, and its per-step loss scale run-length
#: encoded as ``[[scale, steps], ...]`` (the scale is piecewise constant); its judged
#: attributes in full precision; a failed run's traceback; the reference's step timing.
LOSSES_ATTR = "scalertune.losses"
SCALES_ATTR = "scalertune.scales"
JUDGED_ATTR = "scalertune.judged"
TRACEBACK_ATTR = "scalertune.traceback"
TIMES_ATTR = "scalertune.step_times"

#: Optuna's constraint, in the per-key form Optuna writes (``<= 0`` is feasible: the run
#: reached the target) and the list optuna-dashboard reads to mark infeasible trials.
CONSTRAINT_ATTR = "constraints:target_gap"
CONSTRAINTS_ATTR = "constraints"

#: The user attributes that say what a trial runs; a retry copies these and nothing else
#: (not who ran it, nor how far it got).
JOB_ATTRS = ("role", "baseline", "confirms", "seed", "config")
