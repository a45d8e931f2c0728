"""The fp16 block of a DeepSpeed config closest to a GradScaler config.

DeepSpeed's dynamic loss scaler starts at ``2**initial_scale_power``, halves the scale on an
overflow (after ``hysteresis`` of them; 1 backs off on every one, as GradScaler does) but
never below ``min_loss_scale``, and doubles it after ``loss_scale_window`` clean steps. It
grows by 2 and backs off by 0.5 whatever GradScaler's factors; the export says what is lost.
"""

from __future__ import annotations

import math
from typing import Any

from scalertune._amp._config import AmpConfig

#: DeepSpeed's smallest loss scale (its ``min_loss_scale`` default, and the smallest its
#: config takes).
DEEPSPEED_MIN_LOSS_SCALE = 1


def deepspeed_fp16_block(config: AmpConfig) -> dict[str, Any]:
    """The ``fp16`` block (dynamic loss scaling) nearest to ``config``'s scaler."""
    return {
        "enabled": True,
        "loss_scale": 0,
        # 127 at most: 2**128 is past float32 (an init_scale at float32's largest rounds up)
        "initial_scale_power": min(max(round(math.log2(config.init_scale)), 0), 127),
        "loss_scale_window": config.growth_interval,
        "hysteresis": 1,
        "consecutive_hysteresis": False,
        "min_loss_scale": DEEPSPEED_MIN_LOSS_SCALE,
    }
