"""Steps that look at gradients and losses without training: the optimizer is left alone."""

from __future__ import annotations

import torch

from scalertune._amp._runtime import AmpRuntime


class NoStep(AmpRuntime):
    """A runtime whose step leaves the optimizer alone: a workload's own step function runs
    its forward and backward through it (the start-up probe looks at the gradients, the
    late-phase check at the loss), and nothing is applied."""

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Nothing is applied: False, so a step function steps no scheduler either."""
        self.hooks.grads_ready()
        self.steps += 1
        return False
