"""The runtime and the config file a user imports into training code.

- ``_config``: :class:`AmpConfig`, PyTorch's defaults and the baselines;
- ``_runtime``: :class:`AmpRuntime`, the canonical AMP step every trial runs;
- ``_scaler``: the GradScaler the runtime builds, and how it knows which steps were skipped;
- ``_engine``: an engine that scales and steps itself (DeepSpeed's), bound to a runtime;
- ``_guard``: :class:`Guard`, the production guard against a collapsing loss scale;
- ``_watch``: the warning when a training run's scaler leaves the search's prediction;
- ``_islands``, ``_modules``: float32 islands and how modules are named for them;
- ``_device``: which device a run trains on;
- ``_schema``, ``_yaml``: the result YAML, read with size and alias bounds.

Nothing here imports Optuna (an import-linter contract): training code loads a config
without the search's machinery.
"""
