"""Where a config's GradScaler (or DeepSpeed's scaler) would be at a step of the float32
reference's training.

A branch from the reference's checkpoint at step ``n`` must not start its scaler at
``init_scale``: a scale too large backs off on the branch's first steps, and those start-up
skips would be counted against the config in a phase where a real run of it would long have
settled. The replay of the config over the trace up to ``n`` says where the scale is then,
and how many clean steps its growth tracker has counted since the last change.
"""

from __future__ import annotations

from scalertune._amp._config import AmpConfig, DeepSpeedFp16Config
from scalertune._replay._deepspeed import DeepSpeedScaler, replay_deepspeed
from scalertune._replay._gradscaler import replay
from scalertune._replay._trace import Trace


def scaler_state_at(trace: Trace, config: AmpConfig, step: int) -> dict[str, float]:
    """GradScaler's ``scale`` and ``_growth_tracker`` after ``step`` steps under ``config``
    (a ``GradScaler.load_state_dict`` fragment); for a DeepSpeed fp16 config, its scale and
    its scaler's hysteresis left, last overflow and iteration (what a bound engine's
    ``load_scaler_state`` takes)."""
    if isinstance(config, DeepSpeedFp16Config):
        run = replay_deepspeed(
            trace.amax[:step], DeepSpeedScaler.from_config(config), startup=trace.startup
        )
        return {
            "scale": float(run.final_scale),
            "hysteresis": int(run.hysteresis),
            "last_overflow": int(run.last_overflow),
            "iteration": int(step),
        }
    played = replay(trace.amax[:step], config, startup=trace.startup)
    last_skip = int(played.skipped[-1]) if len(played.skipped) else -1
    # after the last skip the tracker counts clean steps, and growth resets it every interval
    tracker = (step - 1 - last_skip) % config.growth_interval
    return {"scale": float(played.final_scale), "_growth_tracker": int(tracker)}
