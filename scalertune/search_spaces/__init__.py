"""The search spaces that ship with scalertune: ``--space default``, ``float16``, ``bfloat16``."""
