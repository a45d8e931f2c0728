"""``scalertune diagnose``: where float16 overflows or underflows, module by module.

- ``_api``: :func:`diagnose`;
- ``_runner``, ``_hooks``: real training steps under hooks on every module;
- ``_locate``, ``_patterns``: the float32 islands that fix a forward overflow, located and
  grouped as glob patterns;
- ``_conclusions``: the verdict and the fix, each claim checked by a real GradScaler run;
- ``_gradients``: the gradients' verdict (overflow, underflow or clean), and the scale that
  fixes them, found by a bisection of real GradScaler runs;
- ``_report``: :class:`Diagnosis` and its table;
- ``_policy``: diagnose's own policy numbers (its largest scale, its probes, how far it
  locates an overflow), each with its reason.
"""
