"""Task items and the source that serves them to the rollout loop.

A source holds a fixed train split and a fixed held-out split. The train split is read as an
endless stream: epoch ``e`` is a permutation of the train items seeded by ``(seed, e)``, and a
position in that stream is a single integer *cursor*. Storing the cursor in a checkpoint is all
that resume needs; the item at a cursor is computed directly, never by replaying the stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def clip(value: object, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters: error messages never echo a huge value."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters]"


@dataclass(frozen=True)
class TaskItem:
    """One problem: the prompt text (before any template), its gold answer, and free metadata.

    ``meta`` holds plain values only (it may travel to other processes). Sources set
    ``meta["id"]``, a stable string naming the item, which error messages and logs use.
    """

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def item_id(self) -> str:
        return str(self.meta.get("id", "?"))


class TaskSource:
    """A named train split (read by cursor, reshuffled each epoch) and a held-out split."""

    def __init__(self, name: str, train: Sequence[TaskItem], val: Sequence[TaskItem]) -> None:
        if not train:
            raise ValueError(f"task source {name!r}: the train split is empty")
        self.name = name
        self._train = tuple(train)
        self._val = tuple(val)
        self._perm_key: tuple[int, int] | None = None
        self._perm: np.ndarray | None = None

    def __len__(self) -> int:
        """Number of train items (one epoch)."""
        return len(self._train)

    def distinct_prompts(self) -> int:
        """How many different prompts the train split holds (a file may repeat a question)."""
        return len({item.prompt for item in self._train})

    def val_items(self) -> list[TaskItem]:
        """The held-out split, in a fixed order."""
        return list(self._val)

    def map_items(self, fn: Callable[[TaskItem], TaskItem]) -> TaskSource:
        """The same source (name, order, splits) with every item passed through ``fn``."""
        return TaskSource(self.name, [fn(it) for it in self._train], [fn(it) for it in self._val])

    def item_at(self, seed: int, cursor: int) -> TaskItem:
        """The train item at position ``cursor`` of the stream for ``seed``."""
        if cursor < 0:
            raise ValueError(f"task source {self.name!r}: cursor must be >= 0, got {cursor}")
        epoch, pos = divmod(cursor, len(self._train))
        return self._train[int(self._permutation(seed, epoch)[pos])]

    def take(self, seed: int, cursor: int, count: int) -> tuple[list[TaskItem], int]:
        """``count`` consecutive train items from ``cursor``, and the cursor after them."""
        if count < 0:
            raise ValueError(f"task source {self.name!r}: count must be >= 0, got {count}")
        return [self.item_at(seed, c) for c in range(cursor, cursor + count)], cursor + count

    def _permutation(self, seed: int, epoch: int) -> np.ndarray:
        if seed < 0:
            raise ValueError(f"task source {self.name!r}: seed must be >= 0, got {seed}")
        key = (seed, epoch)
        if self._perm_key != key:
            rng = np.random.default_rng([seed, epoch])
            self._perm = rng.permutation(len(self._train))
            self._perm_key = key
        assert self._perm is not None
        return self._perm
