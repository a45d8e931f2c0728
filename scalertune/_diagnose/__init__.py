"""``scalertune diagnose``: where float16 overflows or underflows, module by module.

- ``_api``: :func:`diagnose`;
- ``_runner``, ``_hooks``: real training steps under hooks on every module;
- ``_islands``, ``_patterns``: float32 islands for a forward overflow, as glob patterns;
- ``_verdict``: the verdict, each claim checked by a real GradScaler run;
- ``_report``: :class:`Diagnosis` and its table.
"""
