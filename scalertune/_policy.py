"""The policy numbers that more than one stage reads, each with the reason for its value.

These are the facts the stages must agree on: the read-back window, the step timing, the
smoothing and the target's tolerance, the scale floor, the confirmations, the study's stop
rules that the judge applies and the search sets, the phases of a horizon, float16's limits,
and when two skip counts are the same. A number only one stage reads lives in that stage's own
``_policy`` module (``_run/_policy.py``, ``_search/_policy.py``, ``_judge/_policy.py``, ...),
and the bound on a number a user passes beside its check in ``_limits``. The measurements
behind the values are in ``docs/benchmarks.md`` ("Where the policy numbers come from").
"""

#: Steps between two host readbacks of the loss, the loss scale and the step clock.
#: The AMP loop itself never waits for the device; once per window it copies the window's
#: losses and scales to the host in one transfer, checks them, reports them to Optuna and
#: reads the clock. A non-finite trial therefore runs at most ``READBACK_INTERVAL - 1`` steps
#: past its first non-finite step. 10 keeps that waste small while adding one sync per ten
#: steps to GradScaler's own one sync per step.
READBACK_INTERVAL = 10

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

#: Seeds the confirmation reruns use (the search itself runs on ``--seed``, default 0): these,
#: but for the search's own seed (:func:`confirm_seeds`).
CONFIRM_SEEDS = (1, 2)


def confirm_seeds(seed: int) -> tuple[int, ...]:
    """The seeds a search on ``seed`` confirms on: ``CONFIRM_SEEDS``, the search's own seed
    replaced by the next seed that is neither (a confirmation on the search's own seed would
    run the run it confirms again, and float32's spread would rest on one seed fewer).

    >>> confirm_seeds(0), confirm_seeds(1), confirm_seeds(2), confirm_seeds(7)
    ((1, 2), (2, 3), (1, 3), (1, 2))
    """
    seeds: list[int] = []
    other = 1
    while len(seeds) < len(CONFIRM_SEEDS):
        if other != seed:
            seeds.append(other)
        other += 1
    return tuple(seeds)


#: The study stops early when ``STUDY_PATIENCE`` sampled trials in a row (reused duplicates
#: not counted) have not found a faster time to target, once ``STUDY_MIN_TRIALS`` have run.
#: TPE and random search come within 5% of a fine grid's best config in a few trials on the
#: shipped examples, and 4 in a row without progress after at least 6 leave the answer
#: unchanged there, while each further trial costs most of a run (``docs/benchmarks.md``).
STUDY_MIN_TRIALS = 6

#: A faster time to target counts as progress only when it is faster beyond the noise
#: (float32's seed spread of steps to the target, and the step-time spreads): a run that ties
#: with the best changes nothing a tie-break would not. When this many sampled trials in a row
#: reached the target and none after the first was faster than the best beyond that noise, the
#: space's knobs do not change how fast this workload learns, and sampling stops before
#: ``STUDY_MIN_TRIALS``: more trials would each cost most of a run to add another tie, which
#: goes to the more stable, then the simpler config. A trial that did not reach the target, or
#: was pruned, ends the streak: the knobs matter there, and sampling goes on. Three, not two:
#: two stopped the codepoints example before its best clip on a loaded machine
#: (``docs/benchmarks.md``). Not over a horizon longer than a trial, where the trials only find
#: the dtypes and clips that the phases judge, and ties at the trial's end say nothing of the
#: horizon's.
STUDY_TIED_TRIALS = 3

#: A crashed trial is retried this many times; a config that kills its worker twice more is
#: left failed rather than taking the study down with it.
MAX_RETRIES = 2

#: How often an idle worker looks at the study while it waits for other workers.
POLL_S = 0.5

#: float16's limits, which every diagnosis is measured against.
FLOAT16_MAX = 65504.0
FLOAT16_SMALLEST_SUBNORMAL = 2.0**-24  # below half of this, values flush to zero

#: The smallest magnitude float16 rounds to inf: its largest finite value is 65504 and the next
#: step of its grid would be 65536; round-to-nearest-even sends everything from the midpoint
#: 65520 up to inf. The replay's overflow line (measured: 65504 instead changed 1 of 60,000
#: replayed decisions and no skip count; a margin of x0.5 or x2 halved the exact counts).
FLOAT16_OVERFLOW = 65520.0

#: Training steps of a search's trial where neither ``--steps`` nor the factory says fewer: a
#: factory whose training is shorter (a Trainer's ``max_steps`` of 150) trains all of it.
SEARCH_STEPS = 200

#: Training steps ``scalertune diagnose`` watches in each dtype: the first steps are where a
#: forward overflow or a badly chosen initial scale shows.
DIAGNOSE_STEPS = 3

#: ``diagnose`` calls a scale "underflowing" when more than this share of the parameter
#: gradient values that are nonzero in float32 are exactly zero in float16 at that scale
#: (measured on the first step, where both runs start from the same weights and batch). A
#: quarter of the gradient gone is well past noise and is what a flat loss curve looks like.
UNDERFLOW_SHARE = 0.25

#: Rounds of float32 islands ``diagnose`` tries before it gives up on them (and says to use
#: bfloat16). Each round keeps the culprits found so far in float32 and reruns, recomputing
#: any further culprit without submodules in float32 on the spot so that one pass finds all
#: of those; a culprit's own code around its submodules costs a round each.
DIAGNOSE_ISLAND_ROUNDS = 6

#: The phases of a horizon longer than a trial (see ``_judge._phases``). Each finalist is
#: branched from the float32 reference for two windows, one from the middle of the horizon
#: and one ending at it, each this share of the horizon long (at least a trial): two windows of
#: 10% cost 0.2 horizons per finalist, and agreed with full-length runs on every clear case
#: measured, where one window ending at the horizon missed a clip that hurts late
#: (``docs/benchmarks.md``).
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
