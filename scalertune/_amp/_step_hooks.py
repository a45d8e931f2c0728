"""What watches a runtime's steps from outside it: called after each backward and before
each optimizer step, while the gradients are backward's own (the float32 reference's
gradient trace, the ranks' comparison in the first step). Each is registered with a handle
that removes it, as torch's module hooks are, instead of a slot of the runtime set from
another package."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from torch.utils.hooks import RemovableHandle


class StepHooks:
    """The runtime's hooks (:attr:`~scalertune._amp._runtime.AmpRuntime.hooks`), called in
    the order registered.

    Example:
        >>> hooks, seen = StepHooks(), []
        >>> handle = hooks.before_step(lambda: seen.append("step"))
        >>> hooks.grads_ready(); handle.remove(); hooks.grads_ready()
        >>> seen
        ['step']
    """

    def __init__(self) -> None:
        # OrderedDict, as torch's own hooks: a handle holds a weak reference to it
        self._after_backward: OrderedDict[int, Callable[[], None]] = OrderedDict()
        self._before_step: OrderedDict[int, Callable[[], None]] = OrderedDict()

    def after_backward(self, hook: Callable[[], None]) -> RemovableHandle:
        """Call ``hook`` after each backward; returns the handle that removes it."""
        handle = RemovableHandle(self._after_backward)
        self._after_backward[handle.id] = hook
        return handle

    def before_step(self, hook: Callable[[], None]) -> RemovableHandle:
        """Call ``hook`` first in each step; returns the handle that removes it."""
        handle = RemovableHandle(self._before_step)
        self._before_step[handle.id] = hook
        return handle

    @property
    def wants_gradients(self) -> bool:
        """Whether a hook reads the gradients after backward (an engine keeps them then)."""
        return bool(self._after_backward)

    def backward_done(self) -> None:
        if self._after_backward:  # every step: nothing copied where nothing is registered
            for hook in list(self._after_backward.values()):
                hook()

    def grads_ready(self) -> None:
        if self._before_step:
            for hook in list(self._before_step.values()):
                hook()
