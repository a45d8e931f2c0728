"""Loading the user's workload: the factory, the contract it must meet, the trainers it may be.

- ``_loader``: ``path/to/model.py:make_model`` or ``package.module:factory`` to a callable;
- ``_contract``: :class:`Workload`, what a factory returns, and its checks;
- ``_factory``: calling the factory, seeded, and reading its result as a workload;
- ``_rng``: the RNGs a workload draws from, seeded, saved and put back;
- ``_groups``: one optimizer step's micro-batches, for gradient accumulation;
- ``_lightning``: :func:`lightning_workload`, a LightningModule's own ``training_step``, and
  a Lightning ``Trainer`` with its module and data;
- ``_transformers``: a Hugging Face ``Trainer`` (TRL's included), as its ``train()`` trains;
- ``_accelerate``: an Accelerate ``Accelerator`` with what it prepares;
- ``_deepspeed``: a DeepSpeed config with the model, data and loss it trains.
"""
