"""Training frameworks under a runtime's config: what ``scalertune.attach`` and the search's
trainer workloads share.

- ``_route``: :class:`Route`, the runtime a framework's forward and backward go through;
- ``_accelerate``: an Accelerate ``Accelerator``, routed;
- ``_transformers``: a Hugging Face ``Trainer`` (TRL's trainers included), routed;
- ``_lightning``: a Lightning ``Trainer``'s precision plugin, made from the runtime;
- ``_attach``: :func:`attach`, the public call;
- ``_state_file``: the runtime's state as a file of its own in a Trainer's or an
  Accelerator's checkpoint folder, read ``weights_only``;
- ``_detect``: which framework's trainer an object is, the one test of both, and the one
  refusal of a trainer that runs DeepSpeed;
- ``_releases``: which framework a class comes from, and the releases scalertune was checked
  on, refused in one line outside them;
- ``_deepspeed``: DeepSpeed's engine made with a run's precision and bound to its runtime,
  a Hugging Face Trainer made with ``deepspeed=`` under a runtime, and the one refusal of
  what scalertune cannot train in DeepSpeed;
- ``_accelerate_private``, ``_transformers_private``, ``_lightning_private``: each
  framework's internals that scalertune relies on (private names, replaced and overridden
  methods), in one module per framework, each entry checked by a test;
- ``_deepspeed_private``: DeepSpeed's own, the same way (what a Trainer made with
  ``deepspeed=`` relies on of Accelerate and transformers is in their modules).

The frameworks are imported only from the objects a user passes in: none is a dependency.
"""
