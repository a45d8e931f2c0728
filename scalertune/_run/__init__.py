"""One run: a config trained on a fresh workload, watched for non-finite values.

- ``_loop``: the training loop, with one host read-back per window;
- ``_record``: :class:`RunRecord`, what a run did step by step;
- ``_nonfinite``: whether a window went non-finite, and the prune reason;
- ``_preflight``: one float32 step before any study row exists;
- ``_timing``: the interleaved step time of each dtype;
- ``_schedules``: the LR schedules put back after steps that are not training's;
- ``_memory``: giving a finished run's memory back.
"""
