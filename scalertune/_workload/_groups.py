"""The batches of one optimizer step, for a trainer that accumulates gradients.

A trainer with gradient accumulation takes ``accumulate`` micro-batches per optimizer step,
and the last step of a pass over the data takes what is left: Hugging Face's Trainer and
Lightning both step on a pass's last batch. :class:`Groups` is that: a re-iterable whose
passes yield lists of consecutive micro-batches of one pass of the loader, so that the
search's loop, which takes one item per step, takes one optimizer step's batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any


class Groups:
    """``batches`` in lists of ``accumulate`` (the last of a pass shorter), pass by pass.

    ``set_epoch`` tells the pass number to whatever the framework would tell it to
    (``on_epoch``, by default the loader's own ``set_epoch``).
    """

    def __init__(
        self, batches: Any, accumulate: int = 1, *, on_epoch: Callable[[int], None] | None = None
    ) -> None:
        self.batches, self.accumulate = batches, accumulate
        self._on_epoch = on_epoch if on_epoch is not None else getattr(batches, "set_epoch", None)

    def __iter__(self) -> Iterator[list[Any]]:
        batches = iter(self.batches)
        while True:
            group = list(itertools.islice(batches, self.accumulate))
            if not group:
                return
            yield group

    def __len__(self) -> int:
        return -(-len(self.batches) // self.accumulate)  # a pass's last group may be short

    def set_epoch(self, epoch: int) -> None:
        if self._on_epoch is not None:
            self._on_epoch(epoch)
