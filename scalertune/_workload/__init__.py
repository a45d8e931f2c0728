"""Loading the user's workload: the factory, the contract it must meet, LightningModules.

- ``_loader``: ``path/to/model.py:make_model`` or ``package.module:factory`` to a callable;
- ``_contract``: :class:`Workload`, what a factory returns, checked, seeded, on the device;
- ``_lightning``: :func:`lightning_workload`, a LightningModule's own ``training_step``.
"""
