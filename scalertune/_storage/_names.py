"""The names of what a scalertune study stores but its trials' records: the trial roles, the
study's attributes, and the system attributes that hold a trial's curves and big figures.

A study holds the settings it was made with, one trial per run, and a few study attributes
for the once-per-study work. What each trial is, is its ``role``. Big or exact figures go to
system attributes (``scalertune.*``), which the dashboard's tables leave out; rounded
figures for reading go to user attributes, which it shows. A trial's user attributes are
typed records whose keys are their fields' names: :class:`~scalertune._storage._trial_record.Job`
and :class:`~scalertune._storage._trial_record.Marks`, and the judged
:class:`~scalertune._judge._judged.Judged`.
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
#: A finalist branched from the float32 reference's checkpoint for one window of a phase of
#: the horizon (``of``: the finalist's trial, ``start`` and ``end``: the window).
ROLE_PHASE = "phase"
#: A finalist with one module kept in float32, proposed by a late phase where that module's
#: precision limited the fit (``island_of``: the finalist), trained from the start.
ROLE_ISLAND = "island"
#: The float16 scaler setting the replay found best over the horizon, trained to check it.
ROLE_REPLAY = "replay"
#: Runs whose outcome the ranking reads.
RUN_ROLES = (ROLE_SEARCH, ROLE_BASELINE, ROLE_CONFIRM, ROLE_ISLAND, ROLE_REPLAY)

#: Study user attributes: the settings the study was created with, why sampling stopped, and
#: its artifact store (its checkpoints and pictures: a folder, or ``s3://BUCKET``).
SETTINGS_ATTR = "scalertune.settings"
STOPPED_ATTR = "scalertune.stopped_early"
ARTIFACT_DIR_ATTR = "scalertune.artifact_dir"
#: Study user attributes holding the real runs that load the study's answer and check
#: themselves (``scalertune.load``, ``scalertune.attach``): one per run, by ``RUN_PREFIX`` and
#: the run's name (its host, process and start), each the run's record as plain data.
RUN_PREFIX = "scalertune.run."
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
#: The float32 reference's horizon: its length, its per-step losses over each phase window
#: (float32's own continuation) and the checkpoint each window starts from.
HORIZON_ATTR = "scalertune.horizon"
#: The float32 reference's gradient trace (``_replay._trace.Trace.encode``).
TRACE_ATTR = "scalertune.trace"
#: The format of the float32 reference's record (``_judge._reference.VERSION``).
REFERENCE_VERSION_ATTR = "scalertune.reference_version"

#: Optuna's constraint, in the per-key form Optuna writes (``<= 0`` is feasible: the run
#: reached the target) and the list optuna-dashboard reads to mark infeasible trials.
CONSTRAINT_ATTR = "constraints:target_gap"
CONSTRAINTS_ATTR = "constraints"

#: What each trial stores of itself is typed in :mod:`scalertune._storage._trial_record` (what it
#: runs, what the search noted) and :mod:`scalertune._judge._judged` (what was judged).
