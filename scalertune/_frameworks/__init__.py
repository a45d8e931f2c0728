"""Training frameworks under a runtime's config: what ``scalertune.attach`` and the search's
trainer workloads share.

- ``_route``: :class:`Route`, the runtime a framework's forward and backward go through;
- ``_accelerate``: an Accelerate ``Accelerator``, routed;
- ``_transformers``: a Hugging Face ``Trainer`` (TRL's trainers included), routed;
- ``_lightning``: a Lightning ``Trainer``'s precision plugin, made from the runtime;
- ``_attach``: :func:`attach`, the public call;
- ``_detect``: which framework's trainer an object is, the one test of both, and the one
  refusal of a trainer that runs DeepSpeed;
- ``_releases``: which framework a class comes from, and the releases scalertune was checked
  on, refused in one line outside them;
- ``_accelerate_private``, ``_transformers_private``, ``_lightning_private``: each
  framework's internals that scalertune relies on (private names, replaced and overridden
  methods), in one module per framework, each entry checked by a test.

The frameworks are imported only from the objects a user passes in: none is a dependency.
"""
