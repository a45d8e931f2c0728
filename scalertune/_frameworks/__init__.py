"""Training frameworks under a runtime's config: what ``scalertune.attach`` and the search's
trainer workloads share.

- ``_route``: :class:`Route`, the runtime a framework's forward and backward go through;
- ``_accelerate``: an Accelerate ``Accelerator``, routed;
- ``_transformers``: a Hugging Face ``Trainer`` (TRL's trainers included), routed;
- ``_lightning``: a Lightning ``Trainer``'s precision plugin, made from the runtime;
- ``_deepspeed``: DeepSpeed's engine made with a run's precision and bound to its runtime,
  and DeepSpeed's undocumented parts scalertune relies on, in one place;
- ``_attach``: :func:`attach`, the public call.

The frameworks are imported only from the objects a user passes in: none is a dependency.
"""
