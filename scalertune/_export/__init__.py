"""``scalertune export``: the config as the objects each training framework takes.

- ``_api``: :func:`export` and :class:`Export` (torch, Lightning, Accelerate, Transformers,
  DeepSpeed).
"""
