"""``scalertune export``: the config as the objects each training framework takes.

- ``_api``: :func:`export` and :class:`Export` (torch, Lightning, Accelerate, Transformers,
  DeepSpeed, torchao, torchtitan): the config read, checked against the framework, and its
  writer's objects and code;
- ``_torch``, ``_lightning``, ``_accelerate``, ``_transformers``, ``_deepspeed``: each
  framework's writer, its objects from a config (and, for DeepSpeed, the search's evidence);
- ``_code``: one description of each object, built as the object and written as its code.
- ``_torchao``: a float8 config as torchao's ``Float8LinearConfig``, its filter of the layers
  it converts, and Accelerate's ``AORecipeKwargs``.
- ``_torchtitan``: a float8 config as torchtitan's float8 converter and training fields.
"""
