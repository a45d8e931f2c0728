"""The in-run check: the real run compares its loss with float32's at its own weights, and
acts when the precision or the scaler fails late (see ``_checker``).

- ``_checker``: :class:`InRunCheck`, what the runtime calls;
- ``_passes``: the check's extra forward passes on the step's own batch, leaving no trace;
- ``_gap``: the judgement over recent checks, by the horizon's rule;
- ``_culprits``: which module is at fault: its island closes the gap, it overflowed, or its
  outputs are nearest float16's range;
- ``_replicas``: whether N ranks train one model or a copy each (the search refuses copies,
  the check says so once);
- ``_float8_layers``: what float8 costs each Linear layer at the same weights (flushed
  inputs, error against float32): the evidence islands are chosen from, and its lines;
- ``_actions``: what a failed check does by the policy, one line each;
- ``_knobs``: the run's own gradients recorded, and the scaler's knobs chosen by replaying them;
- ``_lines``: the one line each action says, as a warning and in the log;
- ``_run_record``: the run's record, one typed record: what the check made, what the study
  keeps of it, read back from there;
- ``_account``: what ``amp.report()`` and the study show of a run;
- ``_build``: the runtime a result file describes, with its check (``scalertune.load``,
  ``scalertune.attach``).

Like ``_amp``, nothing here imports Optuna: training code loads it. The package imports
nothing on its own (a report reads ``_account`` without loading torch).
"""

from typing import Any

__all__ = ["InRunCheck"]


def __getattr__(name: str) -> Any:
    if name == "InRunCheck":
        from scalertune._inrun._checker import InRunCheck

        return InRunCheck
    raise AttributeError(f"module 'scalertune._inrun' has no attribute {name!r}")
