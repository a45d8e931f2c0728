"""One run's policy numbers, each with the reason for its value: when a finished run's
memory is collected, how long ranks wait for each other, and the gradient trace's resolution
and cost along the float32 reference.

Numbers that more than one stage reads are in ``scalertune._policy``.
"""

from scalertune._policy import MAX_CONSECUTIVE_SKIPS

#: After a run, a full garbage collection frees what a workload's reference cycles hold, but
#: costs about 0.3 s in a process that has imported torch and optuna: more than a whole run of
#: a small model. It runs only after models whose parameters take at least this much (64 MiB,
#: 16M float32 parameters), where the memory it may free is worth more than the time.
RELEASE_COLLECT_BYTES = 64 * 2**20

#: With ``--nproc-per-node``, how long one rank waits for the others in a collective before
#: it gives up (torch's default is 30 minutes for gloo and 10 for NCCL: a hung rank would hold
#: a run that long). The ranks meet at every DDP/FSDP step and once per read-back window, and
#: at start-up, where one rank may build or load its model a while after another; 5 minutes
#: covers that start-up skew for a model that fits a node, and bounds how long a hung rank
#: holds its run when no ``--trial-timeout`` ends it sooner. A rank that dies is seen at once.
COLLECTIVE_TIMEOUT_S = 300

#: The float32 reference's gradient trace keeps its histograms and forward peaks in about
#: this many blocks over the run (per step it keeps only the largest gradient): enough
#: resolution for the underflow of each phase and for a trend, at a few kB whatever the
#: horizon.
TRACE_BLOCKS = 200

#: The gradient trace is collected in full (every leaf module's output gradient, every
#: parameter's, the magnitude histogram, the forward peaks) on the first ``TRACE_FULL_STEPS``
#: steps and on one step in ``TRACE_FULL_EVERY`` after; on the other steps only from the
#: tensors that came within ``TRACE_SUBSET_MARGIN`` of a full step's largest: the full
#: collection costs a step far more (Python hooks on every module, a min-max pass per tensor, a
#: histogram of every gradient value) than the subset, and a subset found over the first 100
#: steps kept the full value on every later step of the workloads measured, where one found in
#: 20 did not. The full steps keep checking it (a tensor that comes close joins the subset) and
#: sample the histograms. The measurements are in ``docs/benchmarks.md``.
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

#: The batches over which the late-phase check evaluates each island candidate at the float32
#: checkpoint's weights (``_search._policy.ISLAND_CANDIDATES``): enough to tell a loss back
#: within the phase tolerance from one that is not, at a small share of a branch's cost.
ISLAND_PROBE_BATCHES = 20
