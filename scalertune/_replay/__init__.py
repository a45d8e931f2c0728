"""GradScaler's behaviour over a whole horizon, replayed from one gradient trace.

- ``_trace``: :class:`Trace`, what the float32 reference records per step (the largest
  gradient float16 would hold) and per block (magnitude histograms, forward peaks), stored
  compact with the study;
- ``_gradscaler``: GradScaler's update rule, exactly, and its replay over a trace for one
  config or many at once;
- ``_deepspeed``, ``_deepspeed_block``: DeepSpeed's dynamic loss scaler, the same way, and
  the ``fp16`` block closest to a GradScaler config;
- ``_state``: where a config's GradScaler would be at a step of the reference's training;
- ``_predict``: :class:`Prediction`, what a config's scaler will do over the horizon;
- ``_forecast``: when a module's forward peaks, at their trend, would reach float16's range;
- ``_policy``: the replay's own policy numbers (the forecast's fit and reach), each with its
  reason.
"""
