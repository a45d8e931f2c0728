"""The search's policy numbers, each with the reason for its value: how often a trial's curve
is written, when the search stops on failures, what the evidence over a horizon may cost, and
how many scaler settings and islands it weighs.

Numbers that more than one stage reads are in ``scalertune._policy``.
"""

#: A running trial's curve points are written to the study together, at most this often
#: (seconds): one transaction per flush instead of one per point (``_search._reports``).
CURVE_FLUSH_S = 1.0

#: A search stops at once, with the error, when this many runs in a row failed with the same
#: exception and none had succeeded yet: the workload is broken, not the config. (A config
#: can legitimately fail on its own, e.g. nn.LSTM under CPU float16 autocast.)
SAME_FAILURES_BEFORE_STOP = 5

#: Over a long horizon the float32 reference also saves a checkpoint after every this many
#: seconds of training (two kept, in turn), besides its fixed ones (each phase window's start,
#: each quarter of the horizon): at --horizon 10,000,000 the first quarter would come after
#: hours. Five minutes bound what a killed worker loses to five minutes, and the cost stays
#: small: a checkpoint writes the weights and the optimizer's state once (about 2 s for a
#: 1B-parameter model's 12 GB at the 6 GB/s of a local NVMe disk: under 1% of five minutes).
CHECKPOINT_EVERY_S = 300.0

#: What a search over a horizon longer than a trial may cost, in run-equivalents of the
#: horizon (the float32 reference is 1). A branch shows whether a config can follow float32
#: from float32's own state, not whether it gets there (bfloat16 can hold in every branch and
#: still stall on a plateau of its own from step 0). So each finalist, in the answer's order, is
#: trained from step 0 as far into the horizon as this cap allows after what the search has
#: spent and its confirmations will: through the middle window at least, on to the horizon
#: where the cap allows, the windows it does not reach branched (``_search._horizon_jobs``).
#: What searches cost under it is in ``docs/benchmarks.md``.
HORIZON_COST_CAP = 3.0

#: At most this many islands are proposed by the late phases: each costs a trial from the start
#: and its branches (0.3 horizons at --horizon 10x --steps).
ISLANDS_PER_SEARCH = 1

#: The layers a float8 search may keep out of float8 (``float8_islands``), from the evidence
#: of what float8 costs each layer on the first batch, worst first: one choice more per
#: layer in the sampler's space; the in-run check looks further where a run needs it.
FLOAT8_ISLAND_CANDIDATES = 2

#: A run's curve in the dashboard has one point per read-back window, up to about this many:
#: a reference to a long horizon is thinned to it (the dashboard draws every point it gets,
#: and a 100,000-step run would otherwise send 10,000).
CURVE_POINTS = 500

#: The scaler settings the replay weighs at once over the horizon, drawn from the space's
#: float16 ranges: 1,000 replay in about a second over a 100,000-step trace on one core
#: (``benchmarks/replay.py``), and a random 1,000 put a setting within a few percent of each
#: knob's best.
REPLAY_CONFIGS = 1000

#: Over a horizon longer than a trial the float16 scaler's knobs are chosen by the replay, not
#: by sampling, and the sampled trials explore what is left (the dtype and the clip): after 4
#: without progress the search moves on to the phases, which keeps a search at
#: --horizon 10x --steps within 3 run-equivalents of the horizon.
STUDY_MIN_TRIALS_LONG = 4

#: Where a finalist falls behind float32 (or goes non-finite) in a phase, the late-phase
#: check evaluates the float32 checkpoint's weights under its autocast with each of the
#: ``ISLAND_CANDIDATES`` modules whose forward outputs the trace saw largest there kept in
#: float32 (over ``_run._policy.ISLAND_PROBE_BATCHES`` batches), largest first: the first that
#: brings its loss back within ``PHASE_TOLERANCE`` of float32's is branched and trained.
#: "The module with the largest late forward peak" picked the right island on every late
#: workload measured, where "the module that feeds the loss" did not.
ISLAND_CANDIDATES = 3
