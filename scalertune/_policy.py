"""Numbers that are policy, in one place, each with the reason for its value.

Everything that decides whether a trial is pruned, whether it "reached the target", or how
its speed is measured reads its threshold from here, so that a reviewer can argue with one
file instead of hunting through the pipeline.
"""

#: After a run, a full garbage collection frees what a workload's reference cycles hold, but
#: costs about 0.3 s in a process that has imported torch and optuna: more than a whole run of
#: a small model. It runs only after models whose parameters take at least this much (64 MiB,
#: 16M float32 parameters), where the memory it may free is worth more than the time.
RELEASE_COLLECT_BYTES = 64 * 2**20

#: Steps between two host readbacks of the loss, the loss scale and the step clock.
#: The AMP loop itself never waits for the device; once per window it copies the window's
#: losses and scales to the host in one transfer, checks them, reports them to Optuna and
#: reads the clock. A non-finite trial therefore runs at most ``READBACK_INTERVAL - 1`` steps
#: past its first non-finite step. 10 keeps that waste small while adding one sync per ten
#: steps to GradScaler's own one sync per step.
READBACK_INTERVAL = 10

#: A running trial's curve points are written to the study together, at most this often
#: (seconds): one transaction per flush instead of one per point (``_search._reports``).
CURVE_FLUSH_S = 1.0

#: Leading windows whose step time is excluded from the median step time. The first steps
#: pay for allocator warm-up, cuBLAS/oneDNN heuristics and autocast's weight-cast cache.
WARMUP_WINDOWS = 1

#: Untimed steps of each dtype before the interleaved timing's first round: the first steps
#: pay for allocator warm-up, cuBLAS/oneDNN heuristics and the optimizer's state, once per
#: dtype (float16 is timed at a scale that never overflows, so it has no start-up skips to
#: wait out). A whole read-back window of each cost a short search 0.15 run-equivalents.
TIMING_WARMUP_STEPS = 3

#: Rounds of interleaved step timing. Once per study, right after the float32 reference, a fresh
#: workload (its learning rates held at 0) runs one read-back window per dtype in turn (float32,
#: bfloat16, float16, float32, ...), after ``TIMING_WARMUP_STEPS`` untimed steps of each. Windows
#: next to each other in time see the same machine load, so the per-round ratio of a dtype's step
#: time to float32's cancels the load. The median ratio is the estimate; the spread every speed
#: claim carries runs from the second-lowest to the second-highest ratio: one window hit by a burst
#: of load on a shared machine (seen here: one 10-step window 30x its neighbours) must not decide,
#: but the spread must still show a machine that is noisy throughout. 6 rounds of 10 steps per dtype
#: cost about one training run in a default space (3 dtypes, 200 steps).
TIMING_ROUNDS = 6

#: Trailing mean over this many steps smooths the per-batch loss before it is compared with
#: the target. One batch's loss is noisy; a short mean makes "reached the target" a property
#: of the run rather than of a lucky batch.
SMOOTHING_STEPS = 10

#: The target is the float32 reference's final smoothed loss, plus this share of it. 10% is
#: the smallest margin that run-to-run noise (batch order, float16's 11-bit mantissa in the
#: loss itself) does not cross on its own, and still far below what a flat (underflowing) or
#: heavily skipping run ends at. A share of the final value, not of the reduction: a loss that
#: falls from 1e10 to 1e7 would otherwise count 2e8 as "as good as float32".
TARGET_TOLERANCE = 0.10

#: A float16 loss scale below 2**-24 (float16's smallest subnormal) flushes every scaled
#: gradient smaller than 1.0 to zero, so a scaler that has backed off this far is no longer
#: finding a workable scale: something overflows at any scale, usually the forward pass.
SCALE_FLOOR = 2.0**-24

#: This many consecutive skipped steps prune a trial: the gradients are non-finite on every
#: step and the scaler is not recovering within a budget any useful config would need.
#: 50 covers a back-off from 2**24 to 2**-24 at backoff 0.5 (48 steps) with room to spare.
MAX_CONSECUTIVE_SKIPS = 50

#: How many of the best-ranked candidates are rerun on other seeds before one is recommended.
CONFIRM_TOP = 3

#: Seeds the confirmation reruns use (the search itself runs on ``--seed``, default 0).
CONFIRM_SEEDS = (1, 2)

#: A float32 reference must lower its smoothed loss by at least this share of where it
#: started, and by more than ``REFERENCE_NOISE_MULTIPLE`` standard errors of its final
#: smoothed loss (the standard deviation of the per-step losses over its last
#: ``SMOOTHING_STEPS`` steps, over the square root of that count): batch-to-batch noise.
#: It must also end more than ``TARGET_TOLERANCE`` below its start, so that the target lies
#: below where every run begins. Below that the target says nothing (every run "reaches" it
#: at once, one that skipped every step included) and the search stops before any trial
#: runs. 1% is far below what any training that learns does in a search's budget of steps;
#: twice the noise keeps a flat, noisy loss from passing as learning.
REFERENCE_MIN_DROP = 0.01
REFERENCE_NOISE_MULTIPLE = 2.0

#: A run stops once it has reached the target: steps to target, its skipped steps and its
#: scale range are then known, and its step time is the study's interleaved figure for its
#: dtype. A run that can no longer reach the target before the best found so far, even at the
#: optimistic end of its dtype's timing spread against the pessimistic end of the best's, is
#: pruned as "slower than the best" (within the noise it could still tie, and ties are
#: decided by stability, so it runs on). A sampled run clipped as the workload clips is not
#: expected at the target before the float32 reference reached it, less a tie's margin (a
#: lower precision learns no faster per step: its rounding adds noise, a skipped step does
#: nothing), and is timed from there: on the codepoints example float32 needs all 200 steps
#: without a clip, the clipped runs about 105, and the unclipped sampled runs stop at their
#: first read-back instead of step 110-120 (8.4 run-equivalents instead of 10.0, timing
#: pinned). The baselines and the replay's choice are evidence the review reads (the scale's
#: story, the replay's check), and run until the best's time alone rules them out.
#:
#: The study stops early when ``STUDY_PATIENCE`` sampled trials in a row (reused duplicates
#: not counted) have not found a faster time to target, once ``STUDY_MIN_TRIALS`` have run.
#: ``benchmarks/sampler.py`` measures how many trials TPE and random search need to come
#: within 5% of the best config of a fine grid over the default space: a median of 2-5 on
#: the shipped examples. 4 in a row without progress after at least 6 leave the answer
#: unchanged there; where every config reaches the target near float32's own step (the
#: classifier), each trial costs most of a run, and 24 trials would cost 24 runs.
STUDY_MIN_TRIALS = 6
#: Over a horizon longer than a trial the float16 scaler's knobs are chosen by the replay, not
#: by sampling, and the sampled trials explore what is left (the dtype and the clip): after 4
#: without progress the search moves on to the phases, which keeps a search at
#: --horizon 10x --steps within 3 run-equivalents of the horizon.
STUDY_MIN_TRIALS_LONG = 4
STUDY_PATIENCE = 4
#: A faster time to target counts as progress only when it is faster beyond the noise
#: (float32's seed spread of steps to the target, and the step-time spreads): a run that ties
#: with the best changes nothing a tie-break would not. When this many sampled trials in a row
#: reached the target and none after the first was faster than the best beyond that noise, the
#: space's knobs do not change how fast this workload learns, and sampling stops before
#: ``STUDY_MIN_TRIALS``: more trials would each cost most of a run to add another tie, which
#: goes to the more stable, then the simpler config. A trial that did not reach the target, or
#: was pruned, ends the streak: the knobs matter there, and sampling goes on. On the shipped
#: classifier every config reaches the target near float32's own step (147): three trials in
#: a row say so, and the search costs 9-10 run-equivalents instead of 14-15; what the next
#: trials would have found, a clip of about 0.45 reaching it at step 127, is beyond float32's
#: 13% seed spread by 1%, so a float32 at that clip that was the answer becomes float32
#: without one (see ``benchmarks/default_cost.py``). Two in a row stopped the codepoints
#: example before its best clip on a loaded machine; three do not. Not over a horizon longer
#: than a trial, where the trials only find the dtypes and clips that the phases judge, and
#: ties at the trial's end say nothing of the horizon's.
STUDY_TIED_TRIALS = 3

#: A sampled config identical to one the study has finished is not trained again: its result
#: is reused. This many reused ones in a row mean the sampler has nothing new to propose
#: (a small or purely categorical space), and the search stops.
MAX_CONSECUTIVE_DUPLICATES = 10

#: A search stops at once, with the error, when this many runs in a row failed with the same
#: exception and none had succeeded yet: the workload is broken, not the config. (A config
#: can legitimately fail on its own, e.g. nn.LSTM under CPU float16 autocast.)
SAME_FAILURES_BEFORE_STOP = 5

#: RDB storages (SQLite, PostgreSQL, MySQL) record a heartbeat for every running trial this
#: often (seconds). A trial whose heartbeat is older than ``HEARTBEAT_GRACE_S`` belongs to a
#: worker that died: it is marked failed and its config retried. The grace is three beats, so
#: one slow database write does not fail a healthy trial.
HEARTBEAT_INTERVAL_S = 5
HEARTBEAT_GRACE_S = 15

#: A crashed trial is retried this many times; a config that kills its worker twice more is
#: left failed rather than taking the study down with it.
MAX_RETRIES = 2

#: A storage (or artifact store) that fails in a way that passes (a restart, a failover, a
#: dropped connection) is retried for up to ``STORAGE_OUTAGE_S``, the wait between tries
#: doubling from ``STORAGE_RETRY_FIRST_S`` to ``STORAGE_RETRY_MAX_S``. A PostgreSQL restart
#: (``pg_ctl restart -m fast``) is gone in seconds; a managed database's failover takes one to
#: two minutes (60-120 s, as AWS documents for RDS Multi-AZ). Past two minutes the outage is
#: not a blip and needs a person: the worker ends, nothing lost, and a rerun resumes. The
#: first wait is short because most outages here are a dropped connection, made again at once;
#: 8 s between tries keeps a waiting fleet of workers from hammering a server coming back.
STORAGE_OUTAGE_S = 120.0
STORAGE_RETRY_FIRST_S = 0.5
STORAGE_RETRY_MAX_S = 8.0

#: Over a long horizon the float32 reference also saves a checkpoint after every this many
#: seconds of training (two kept, in turn), besides its fixed ones (each phase window's start,
#: each quarter of the horizon): at --horizon 10,000,000 the first quarter would come after
#: hours. Five minutes bound what a killed worker loses to five minutes, and the cost stays
#: small: a checkpoint writes the weights and the optimizer's state once (about 2 s for a
#: 1B-parameter model's 12 GB at the 6 GB/s of a local NVMe disk: under 1% of five minutes).
CHECKPOINT_EVERY_S = 300.0

#: Workers coordinate the once-per-study runs (the float32 reference, the baselines, the
#: confirmations) with a claim in the study: write it, wait this long, read it back. Writes take
#: milliseconds, so two workers racing for a claim both read the later one after the wait.
CLAIM_SETTLE_S = 0.25

#: A claim holder refreshes its claim this often while it works; a claim not refreshed for
#: ``CLAIM_STALE_S`` belongs to a worker that died, and another worker takes it over.
CLAIM_REFRESH_S = 5
CLAIM_STALE_S = 30

#: How often an idle worker looks at the study while it waits for other workers.
POLL_S = 0.5

#: With ``--nproc-per-node``, how long one rank waits for the others in a collective before
#: it gives up (torch's default is 30 minutes for gloo and 10 for NCCL: a hung rank would hold
#: a run that long). The ranks meet at every DDP/FSDP step and once per read-back window, and
#: at start-up, where one rank may build or load its model a while after another; 5 minutes
#: covers that start-up skew for a model that fits a node, and bounds how long a hung rank
#: holds its run when no ``--trial-timeout`` ends it sooner. A rank that dies is seen at once.
COLLECTIVE_TIMEOUT_S = 300

#: The most ranks ``--nproc-per-node`` starts on one host: the most devices one node holds
#: (8 GPUs is the common node; 64 leaves room for CPU ranks), past which a number is a typo.
MAX_NPROC_PER_NODE = 64

#: After the first rank of a run fails, the launcher waits this long (seconds) for the others
#: to report or die before it kills them all: a rank that dies makes its peers fail in their
#: next collective within milliseconds, and the record must name the rank that died, not the
#: peer whose collective broke first.
RANK_SETTLE_S = 2.0

#: float16's limits, which every diagnosis is measured against.
FLOAT16_MAX = 65504.0
FLOAT16_SMALLEST_NORMAL = 2.0**-14  # below this, values lose precision (subnormal)
FLOAT16_SMALLEST_SUBNORMAL = 2.0**-24  # below half of this, values flush to zero
#: The smallest magnitude float16 rounds to inf: its largest finite value is 65504 and the next
#: step of its grid would be 65536; round-to-nearest-even sends everything from the midpoint
#: 65520 up to inf. The replay's overflow line (measured: 65504 instead changed 1 of 60,000
#: replayed decisions and no skip count; a margin of x0.5 or x2 halved the exact counts).
FLOAT16_OVERFLOW = 65520.0

#: Training steps ``scalertune diagnose`` watches in each dtype: the first steps are where a
#: forward overflow or a badly chosen initial scale shows.
DIAGNOSE_STEPS = 3

#: ``diagnose`` calls a scale "underflowing" when more than this share of the parameter
#: gradient values that are nonzero in float32 are exactly zero in float16 at that scale
#: (measured on the first step, where both runs start from the same weights and batch). A
#: quarter of the gradient gone is well past noise and is what a flat loss curve looks like.
UNDERFLOW_SHARE = 0.25

#: The largest loss scale ``diagnose`` suggests: the top of the shipped float16 space's
#: init_scale range. (Its smallest is ``SCALE_FLOOR``: below it a search prunes the run.)
DIAGNOSE_MAX_SCALE = 2.0**24

#: Real float16 runs ``diagnose`` spends finding a scale that does not skip (or flush): a
#: bisection over the 48 powers of two between the floors settles in 6; 8 leaves room for a
#: first guess, taken from the float32 gradient sizes, that misses.
DIAGNOSE_MAX_PROBES = 8

#: Rounds of float32 islands ``diagnose`` tries before it gives up on them (and says to use
#: bfloat16). Each round keeps the culprits found so far in float32 and reruns, recomputing
#: any further culprit without submodules in float32 on the spot so that one pass finds all
#: of those; a culprit's own code around its submodules costs a round each.
DIAGNOSE_ISLAND_ROUNDS = 6

#: A search names the module of a forward overflow by replaying the pruned trial up to its
#: first non-finite step, at most this many steps: a later overflow costs more replay than a
#: hint is worth, and ``scalertune diagnose`` finds it.
LOCATE_MAX_STEPS = 50

#: The production guard's floor sits this many powers of two below the smallest loss scale
#: the recommended config reached in the search (on any seed): far enough that a longer run's
#: ordinary back-offs never trip it, close enough to stop a collapse long before the floor of
#: a search (2**-24).
GUARD_SCALE_MARGIN_POWERS = 10

#: Significant digits of the figures shown for reading (notes, trial attributes in the
#: dashboard). Step times vary by more than 0.1% from run to run, so a fifth digit is noise;
#: full precision stays in what the search stores and in ``scalertune report --json``.
READABLE_DIGITS = 4

#: Workers that start at once on a new RDB storage race to create its tables; the losers
#: open it again until the winner has made them. Creating Optuna's tables takes well under a
#: second, even on a loaded host; past this, the error is real and is reported.
COLD_START_S = 10

#: The largest YAML file scalertune reads (a search space, a result file). A result file is a
#: few KB and a space a few hundred bytes; 1 MiB leaves room for any hand-written comment and
#: stops a wrong file (a dataset, a log) before the YAML parser spends memory on it.
MAX_YAML_BYTES = 2**20

#: The most values a YAML file may hold once its aliases are expanded. Aliases let a few
#: hundred bytes stand for billions of values (the "billion laughs"); anything that walks the
#: data (a ``str()``, a JSON dump into the study) would expand them. A real file has dozens.
MAX_YAML_VALUES = 10_000

#: ``--seed`` is used as is by ``random``, NumPy and torch; NumPy's legacy seeding accepts
#: 0 to 2**32 - 1, the narrowest of the three.
MAX_SEED = 2**32 - 1

#: The most training steps a run may take. A run keeps its per-step loss and loss scale in
#: device buffers and in the study, so an absurd --steps fails late, in the reference run;
#: a million steps is far past where a scaler's settings show (its growth interval defaults
#: to 2000 steps), yet a few MB per run.
MAX_STEPS = 1_000_000

#: The longest horizon a search may cover. The float32 reference trains that far once and
#: keeps its per-step loss and a compact gradient trace (a few bytes a step); ten million
#: steps is past any training run a search would be asked about, yet a bounded record.
MAX_HORIZON = 10_000_000

#: The phases of a horizon longer than a trial (see ``_judge._phases``). Each finalist is
#: branched from the float32 reference for two windows, one from the middle of the horizon
#: and one ending at it, each this share of the horizon long (at least a trial). Measured on
#: late-failing workloads the team built (bfloat16's precision floor on outputs near 1000 and
#: 2e4, a clip that helps early and hurts late, activations that grow past float16's range) and
#: on a classifier where every config holds, with full-length runs on three seeds as the
#: truth: this design agreed on all 54 clear cases; windows of 5% ending at the horizon alone
#: missed the clip that hurts late. Two windows of 10% cost 0.2 horizons per finalist.
PHASE_WINDOW_SHARE = 0.1

#: A branch falls behind float32 in a phase when its mean loss over the last half of the
#: window is more than this share above float32's, paired step by step. The bar a user
#: checks is the horizon's end within 1.25x of float32's loss; measured, the worst config
#: that held there read 1.13 in its branch (bfloat16 with its last layer in float32), the
#: weakest real failure 1.56, every other failure 2.1 or non-finite.
PHASE_TOLERANCE = 0.25

#: ... and by more than this many standard errors of the paired difference (from 10-step
#: block means): a noisy window of a config that ties float32 is not an alarm. On the
#: classifier, where every config holds, no window of 50-200 steps reached 1.10.
PHASE_Z = 2.0

#: A branch whose losses are inf/NaN on more than this share of its window has gone
#: non-finite there (a few inf losses are GradScaler's skipped steps, which it recovers from).
PHASE_NONFINITE_SHARE = 0.05

#: The most finalists of the short search that get evidence over the horizon: PyTorch's
#: defaults and the best of each family (dtype, clipped or not) among them, taken in the
#: answer's order until one holds and is confirmed (the first from step 0, see
#: ``HORIZON_COST_CAP``; a branched one costs 0.2 horizons).
PHASE_FINALISTS = 3

#: What a search over a horizon longer than a trial may cost, in run-equivalents of the
#: horizon (the float32 reference is 1). A branch shows whether a config can follow float32
#: from float32's own state, not whether it gets there: on a regression MLP a new user wrote,
#: bfloat16 held in every branch from float32's weights (0.98-0.99x) and ended 1.84x
#: float32's loss trained from step 0 (up to 60x on other seeds), stalled on a plateau of its
#: own. So each finalist, in the answer's order, is trained from step 0 as far into the
#: horizon as this cap allows after what the search has spent and its confirmations will:
#: through the middle window at least (where that plateau showed, 1.33x), on to the horizon
#: from its own state where the cap allows, the windows it does not reach branched
#: (``_search._horizon_jobs``). Measured: 2.4-2.97 on seven late and new users' workloads at
#: 10-15x ``--steps``.
HORIZON_COST_CAP = 3.0

#: At most this many islands are proposed by the late phases: each costs a trial from the start
#: and its branches (0.3 horizons at --horizon 10x --steps).
ISLANDS_PER_SEARCH = 1

#: The float32 reference's gradient trace keeps its histograms and forward peaks in about
#: this many blocks over the run (per step it keeps only the largest gradient): enough
#: resolution for the underflow of each phase and for a trend, at a few kB whatever the
#: horizon.
TRACE_BLOCKS = 200

#: The gradient trace is collected in full (every leaf module's output gradient, every
#: parameter's, the magnitude histogram, the forward peaks) on the first ``TRACE_FULL_STEPS``
#: steps and on one step in ``TRACE_FULL_EVERY`` after; on the other steps only from the
#: tensors that came within ``TRACE_SUBSET_MARGIN`` of a full step's largest. Measured on a
#: 2-core CPU, the full collection costs 14-50% per step (Python hooks on every module, a
#: min-max pass per tensor, a histogram of every gradient value); the subset found in the
#: first 100 steps reproduced the full value on every later step of six workloads (it was 1 of
#: 18 module outputs and 11 of 27 parameters of a TransformerEncoder, at 3.8% per step), while
#: a subset picked in 20 steps missed the largest gradient by 2-4x. The full steps keep
#: checking it (a tensor that comes close joins the subset) and sample the histograms.
#: ``benchmarks/trace.py`` measures the whole (subset steps and one full step in 50) at
#: 4-7.5% per step on transformers of 5 ms steps, over the 5% aimed at on GPT-2 and the
#: encoder; one full step in 250 brings BERT, a TransformerEncoder and GPT-2 to 3.4-5%; the
#: rest is the subset's hooks (about 35 us per hooked module output) and min-max passes.
TRACE_FULL_STEPS = 100
TRACE_FULL_EVERY = 50
#: Over a horizon past ``TRACE_FULL_EVERY * TRACE_FULL_SAMPLES`` steps (20,000), the full
#: steps are spread to about this many: two per trace block, enough to check the subset, to
#: sample each block's histogram and forward peaks, while a full step (2.5x a plain step on
#: GPT-2, a histogram pass over every gradient) costs the long reference under 1% a step.
TRACE_FULL_SAMPLES = 2 * TRACE_BLOCKS
TRACE_SUBSET_MARGIN = 4.0
#: The subset leaves out a module output whose gradient was at most another's on every full
#: step (``_run._trace_collector``), tracked over up to this many leaf modules (a matrix of
#: their pairs, kept in the reference's checkpoint; past it, nothing is left out). On GPT-2 it
#: halves the hooked outputs (11.5 to 3.8 per step), and in every step of 600, fully watched,
#: of GPT-2, BERT, a TransformerEncoder and codepoints, the largest gradient stayed that of
#: the full collection.
TRACE_DOMINANCE_MODULES = 1024

#: The start-up probe runs this many of the first batches through forward and backward at the
#: initial weights, before the reference trains: a loss scale too large for them skips step
#: after step from the start, and while it does the weights stay initial, so those steps see
#: these gradients, not the trained ones of the trace. The longest start-up streak a search
#: lets run is ``MAX_CONSECUTIVE_SKIPS``. Measured, the probe made the predicted start-up streak
#: exact on 30 of 30 configs of six workloads (3 of 30 without it on the summed-loss example).
STARTUP_PROBE_BATCHES = MAX_CONSECUTIVE_SKIPS

#: A run's curve in the dashboard has one point per read-back window, up to about this many:
#: a reference to a long horizon is thinned to it (the dashboard draws every point it gets,
#: and a 100,000-step run would otherwise send 10,000).
CURVE_POINTS = 500

#: Two runs of one dtype tie when their steps to the target differ by less than float32's own
#: seed-to-seed spread (its steps to its target on the search's three seeds), and a tie goes to
#: the simpler config. The spread of three seeds can come out near zero by chance (every run
#: of the classifier reaches its target at step 176-177); 2% keeps a difference of a few steps
#: from deciding: below the target's own tolerance, and below what a rerun moves.
SEED_SPREAD_FLOOR = 0.02

#: Skipped-step counts within max(2, 20%) of each other are the same: the replay of a scaler
#: over the float32 trace predicts a real run's count within that on at least 90% of random
#: float16 configs (measured on six workloads, 30 configs each, over 2000 steps: the bar the
#: calibration holds), and two seeds of one config differ by about as much.
SKIP_TOLERANCE_STEPS = 2
SKIP_TOLERANCE_SHARE = 0.2

#: Skips no further apart than this, from the start of training, make the start-up burst that
#: ``describe`` names apart ("15 steps in the first 20"): a start-up back-off skips step after
#: step, or every few steps while the weights move faster than the scale backs off (gaps of 1
#: to 5 on the codepoints example); later skips come one per growth, at least
#: ``growth_interval + 1`` apart, and the shipped space's smallest interval is 10.
STARTUP_GAP = 10

#: Where a finalist falls behind float32 (or goes non-finite) in a phase, the late-phase
#: check evaluates the float32 checkpoint's weights under its autocast with each of the
#: ``ISLAND_CANDIDATES`` modules whose forward outputs the trace saw largest there kept in
#: float32, over ``ISLAND_PROBE_BATCHES`` batches, largest first: the first that brings its loss
#: back within ``PHASE_TOLERANCE`` of float32's is branched and trained. Measured on the team's
#: late workloads, "the module with the largest late forward peak" picked the right island
#: every time (the last layer of a regression to readings near 1000 or 2e4; the first layer of
#: a model whose activations grow past float16's range), where "the module that feeds the
#: loss" picked the wrong one for the latter.
ISLAND_CANDIDATES = 3
ISLAND_PROBE_BATCHES = 20

#: The scaler settings the replay weighs at once over the horizon, drawn from the space's
#: float16 ranges: 1,000 replay in about a second over a 100,000-step trace on one core
#: (``benchmarks/replay.py``), and a random 1,000 put a setting within a few percent of each
#: knob's best.
REPLAY_CONFIGS = 1000

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
