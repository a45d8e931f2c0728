"""The runtime and the config file a user imports into training code.

- ``_config``: :class:`AmpConfig`, PyTorch's defaults and the baselines;
- ``_runtime``: :class:`AmpRuntime`, the canonical AMP step every trial runs;
- ``_autocast``: its forward side (autocast, islands, the check's float32 passes) and the
  unscale-then-clip;
- ``_scaler``: the GradScaler the runtime builds, how it knows which steps were skipped, and
  its knobs changed in place;
- ``_engine``: an engine that scales and steps itself (DeepSpeed's), bound to a runtime;
- ``_scaling``: what scales a runtime's loss (its GradScaler, or a bound engine's) and steps,
  the scale read, the scaler's state in a checkpoint, its knobs changed;
- ``_decisions``: the steps its scaler decided: counted, the skips among them, the read-back;
- ``_step_hooks``: what watches a runtime's steps from outside it, each with a removable handle;
- ``_readback``: what runs at the read-back cadence: the guard, the watch, the in-run check;
- ``_check``: the in-run check's policy, as the result file carries it, and what it says;
- ``_guard``: :class:`Guard`, the production guard against a collapsing loss scale;
- ``_watch``: the warning when a training run's scaler leaves the search's prediction;
- ``_fingerprint``: the model a result file was searched on, and the warning for another;
- ``_islands``, ``_modules``: float32 islands and how modules are named for them;
- ``_torch_private``: every private name of torch used, and the releases checked;
- ``_float8``, ``_torchao_private``: the Linear layers trained in float8 through torchao,
  only inside a float8 runtime's forward; every name of torchao used, and its releases;
- ``_device``: which device a run trains on;
- ``_schema``, ``_yaml``: the result YAML, read with size and alias bounds;
- ``_regular``: a file handed over (a YAML, a runtime's state) read once, bounded, a regular
  file only;
- ``_policy``: the runtime's own policy numbers (a YAML file's size and value bounds), each
  with its reason.

Nothing here imports Optuna (an import-linter contract): training code loads a config
without the search's machinery.
"""
