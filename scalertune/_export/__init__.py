"""``scalertune export``: the config as the objects each training framework takes.

- ``_api``: :func:`export` and :class:`Export` (torch, Lightning, Accelerate, Transformers,
  DeepSpeed, torchao, torchtitan).
- ``_code``: one description of each object, built as the object and written as its code.
- ``_torchao``: a float8 config as torchao's ``Float8LinearConfig``, its filter of the layers
  it converts, and Accelerate's ``AORecipeKwargs``.
- ``_torchtitan``: a float8 config as torchtitan's float8 converter and training fields.
"""
