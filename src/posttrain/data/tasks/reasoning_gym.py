"""Procedural datasets from the ``reasoning-gym`` package, generated offline.

``reasoning_gym.create_dataset(name, seed=, size=)`` builds entry ``i`` from ``seed + i`` alone,
so one generator serves both splits: entries ``0 .. val_size-1`` are held out, and train takes
the following entries, skipping any whose question equals a held-out one. Each item keeps what
the package's own scorer needs: ``meta["dataset"]`` (the registered name) and
``meta["entry_metadata"]`` (the entry's metadata).
"""

from __future__ import annotations

import importlib

from posttrain.data.tasks.base import TaskItem, TaskSource
from posttrain.data.tasks.jsonl import TaskDataError

# How many generated entries may be skipped (as repeats of held-out questions) per train item
# before the dataset is judged too small to give disjoint splits.
_MAX_DRAWS_PER_ITEM = 4


def import_reasoning_gym():
    """The ``reasoning_gym`` module, or an error saying how to install it."""
    try:
        return importlib.import_module("reasoning_gym")
    except ImportError as e:
        raise TaskDataError(
            "the reasoning_gym task and verifier need the 'reasoning-gym' package: "
            "pip install 'posttrain[reasoning]'"
        ) from e


def make_reasoning_gym_source(
    *, dataset: str, seed: int, train_size: int, val_size: int, options: dict | None = None
) -> TaskSource:
    """A source of ``train_size`` train and ``val_size`` held-out entries of ``dataset``."""
    rg = import_reasoning_gym()
    if train_size < 1 or val_size < 0:
        raise TaskDataError(
            f"reasoning_gym task: need train_size >= 1 and val_size >= 0, "
            f"got {train_size} and {val_size}"
        )
    bound = val_size + _MAX_DRAWS_PER_ITEM * train_size
    try:
        ds = rg.create_dataset(dataset, seed=seed, size=bound, **(options or {}))
    except (ValueError, TypeError, AssertionError) as e:
        raise TaskDataError(f"reasoning_gym task: cannot create dataset {dataset!r}: {e}") from e
    val = [_item(dataset, i, ds[i]) for i in range(val_size)]
    held = {item.prompt for item in val}
    train: list[TaskItem] = []
    i = val_size
    while len(train) < train_size:
        if i >= bound:
            raise TaskDataError(
                f"reasoning_gym task: dataset {dataset!r} gave only {len(train)} train entries "
                f"distinct from the {val_size} held-out ones in {bound} draws; lower "
                "train_size/val_size or use a dataset with more variety"
            )
        item = _item(dataset, i, ds[i])
        if item.prompt not in held:
            train.append(item)
        i += 1
    return TaskSource(f"reasoning_gym({dataset})", train, val)


def _item(dataset: str, index: int, entry: dict) -> TaskItem:
    return TaskItem(
        prompt=str(entry["question"]),
        answer=str(entry["answer"]),
        meta={
            "id": f"{dataset}/{index}",
            "dataset": dataset,
            "entry_metadata": dict(entry.get("metadata") or {}),
        },
    )
