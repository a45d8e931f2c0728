"""One run: a config trained on a fresh workload, watched for non-finite values.

- ``_loop``: the training loop, with one host read-back per window;
- ``_record``: :class:`RunRecord`, what a run did step by step;
- ``_nonfinite``: whether a window went non-finite, and the prune reason;
- ``_preflight``: one float32 step before any study row exists;
- ``_timing``: the interleaved step time of each dtype;
- ``_step_times``: :class:`StepTimes`, what the timing measured, read without torch;
- ``_schedules``: the LR schedules put back after steps that are not training's;
- ``_checkpoint``: a run's state saved and restored (the float32 reference's, a branch's);
- ``_checkpoint_file``: what a checkpoint file may hold (tensors and plain data), read back
  without running anything in it, and checked against the workload it is loaded into;
- ``_trace_collector``: the gradient trace recorded along the float32 reference;
- ``_probe``: a runtime whose step leaves the optimizer alone (the start-up probe, the
  late-phase check);
- ``_forward``: a config's forward loss at float32's own weights;
- ``_memory``: giving a finished run's memory back;
- ``_ranks``: a run as N ranks of a process group: joining it, and what the ranks share
  once per window (the losses averaged, the scaler checked to agree);
- ``_policy``: the run's own policy numbers (the trace's resolution and cost, the ranks'
  timeout, when memory is collected), each with its reason.
"""
