"""Build a task source from plain config values.

The config layer owns every default; this factory has none of its own. Each task reads only its
own arguments and rejects a missing one by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from posttrain.data.tasks.arithmetic import make_arithmetic_source
from posttrain.data.tasks.base import TaskSource
from posttrain.data.tasks.jsonl import make_jsonl_source
from posttrain.data.tasks.reasoning_gym import make_reasoning_gym_source

TaskKind = Literal["arithmetic", "jsonl", "reasoning_gym"]
TASKS: tuple[str, ...] = ("arithmetic", "jsonl", "reasoning_gym")


def make_task_source(
    task: TaskKind,
    *,
    seed: int | None = None,
    digits: int | None = None,
    operators: str | None = None,
    exact_digits: bool = False,
    train_size: int | None = None,
    val_size: int | None = None,
    train_path: str | Path | None = None,
    val_path: str | Path | None = None,
    reasoning_gym_dataset: str | None = None,
    reasoning_gym_options: dict | None = None,
) -> TaskSource:
    """The source for ``task``.

    arithmetic reads seed, digits, operators, exact_digits, train_size, val_size.
    jsonl reads train_path and val_path (optional: no held-out split without it).
    reasoning_gym reads reasoning_gym_dataset, seed, train_size, val_size.
    """
    if task == "arithmetic":
        return make_arithmetic_source(
            seed=_need(task, "seed", seed),
            digits=_need(task, "digits", digits),
            operators=_need(task, "operators", operators),
            exact_digits=exact_digits,
            train_size=_need(task, "train_size", train_size),
            val_size=_need(task, "val_size", val_size),
        )
    if task == "jsonl":
        return make_jsonl_source(_need(task, "train_path", train_path), val_path)
    if task == "reasoning_gym":
        return make_reasoning_gym_source(
            dataset=_need(task, "reasoning_gym_dataset", reasoning_gym_dataset),
            options=reasoning_gym_options,
            seed=_need(task, "seed", seed),
            train_size=_need(task, "train_size", train_size),
            val_size=_need(task, "val_size", val_size),
        )
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def _need(task: str, name: str, value: Any) -> Any:
    if value is None or value == "":
        raise ValueError(f"task {task!r} needs {name} (it is not set)")
    return value
