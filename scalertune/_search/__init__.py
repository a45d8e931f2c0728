"""The search: :func:`scalertune.search`, one worker's part of a study.

- ``_api``: :func:`search`, from a factory spec to a confirmed recommendation, and the cost
  said up front;
- ``_options``: a search's options in one record, each checked once, and the isolation of
  its runs;
- ``_setup``: what a worker checks before it writes anything, and works with after;
- ``_space``, ``_sampler``: search spaces (the config a trial's parameters name, and back),
  and the sampler that keeps to their dtypes;
- ``_deepspeed``: a DeepSpeed workload's space, in the knobs of DeepSpeed's loss scaler;
- ``_float8_space``: float8's knobs in a space, the layers a float8 trial may keep out of
  float8 (from the evidence), and the default space gaining float8 where it runs natively;
- ``_study``: the study, its settings, and the records a search writes to it;
- ``_pipeline``: one worker's part, phase by phase;
- ``_references``: the float32 reference of each seed, and the step timing;
- ``_reference_training``: the float32 reference's training run, its retries, and a refused
  one's study removed;
- ``_reference_checkpoints``: the float32 reference's checkpoints: where they are saved,
  resumed from, and rebuilt when lost;
- ``_trials``: one trial: take a queued run or sample a config, reuse a twin, train, store;
- ``_rules``: when a run stops, and how long it may train;
- ``_reuse``: a twin that already ran, and a forward overflow's modules named;
- ``_reports``: a run's curve, written while it trains;
- ``_jobs``: the once-per-study runs (baselines, confirmations, the recommended trial);
- ``_horizon_jobs``, ``_branch``: the evidence over a long horizon, finalist by finalist:
  runs from step 0 and branches from float32's checkpoints;
- ``_island_choice``: the float32 island a late phase proposes;
- ``_replay_choice``: the float16 scaler setting the replay finds best over the horizon;
- ``_recommended``: the recommended trial, where the dashboard looks for the answer;
- ``_isolate``: where runs execute (in this process, or fresh ones);
- ``_launch``: a run, the step timing, a forward overflow's replay and the ranks' preflight,
  each in processes of its own: one with ``--isolate``, one per rank with
  ``--nproc-per-node``;
- ``_process_jobs``: the jobs those processes do, and their replies, as typed records;
- ``_progress``: the line per run on stderr, or the progress bar;
- ``_policy``: the search's own policy numbers (the horizon's cost cap, the replay's and
  the islands' counts, the curve's writes, failures before a stop), each with its reason.
"""
