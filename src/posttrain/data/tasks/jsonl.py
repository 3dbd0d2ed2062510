"""GSM8K-format JSON Lines files from a local path.

Each non-blank line is an object with string fields ``question`` and ``answer``; the answer is a
worked solution whose last line is ``#### N`` with ``N`` a number (thousands commas allowed). The
item's gold answer is ``N`` without commas; the full solution is kept in ``meta["solution"]``.
Any malformed line stops loading with :class:`TaskDataError` naming the file and 1-based line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from posttrain.data.tasks.base import TaskItem, TaskSource, clip

_NUMBER = re.compile(r"-?\d+(\.\d+)?")


class TaskDataError(ValueError):
    """A task data file is missing or malformed; the message names the file and line."""


def read_gsm8k_jsonl(path: str | Path) -> list[TaskItem]:
    """Parse a GSM8K-format file into task items (``meta["id"]`` is ``"<file name>:<line>"``)."""
    p = Path(path)
    if not p.is_file():
        raise TaskDataError(f"{p}: no such file (task data path)")
    items = [_parse_row(where, row) for where, row in jsonl_objects(p, TaskDataError)]
    if not items:
        raise TaskDataError(f"{p}: no rows (the file is empty or blank)")
    return items


def jsonl_objects(path: Path, error: type[Exception]) -> Iterator[tuple[str, dict]]:
    """``("file:line", object)`` for every non-blank line of a JSON Lines file; a line that is
    not UTF-8, not JSON or not an object raises ``error`` naming it."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise error(
                    f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1}); "
                    "re-encode the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise error(f"{where}: expected a JSON object, got {type(row).__name__}")
            yield where, row


def _parse_row(where: str, row: dict) -> TaskItem:
    for key in ("question", "answer"):
        if key not in row:
            raise TaskDataError(f"{where}: missing field {key!r} (have {sorted(row)})")
        if not isinstance(row[key], str) or not row[key].strip():
            raise TaskDataError(f"{where}: field {key!r} must be a non-empty string")
    solution = row["answer"]
    if "####" not in solution:
        raise TaskDataError(f"{where}: field 'answer' has no final '#### N' line")
    final = solution.rsplit("####", 1)[1].strip()
    number = final.replace(",", "")
    if not _NUMBER.fullmatch(number):
        raise TaskDataError(f"{where}: the value after '####' must be a number, got {clip(final)}")
    return TaskItem(
        prompt=row["question"].strip(),
        answer=number,
        meta={"id": Path(where).name, "solution": solution},  # "<file name>:<line>"
    )


def make_jsonl_source(train_path: str | Path, val_path: str | Path | None) -> TaskSource:
    """A source over a train file and an optional held-out file (no held-out split if None).

    A held-out question that also appears in the train file is an error: it would leak.
    """
    train = read_gsm8k_jsonl(train_path)
    val = read_gsm8k_jsonl(val_path) if val_path is not None else []
    seen = {item.prompt: item.item_id for item in train}
    for item in val:
        if item.prompt in seen:
            raise TaskDataError(
                f"{val_path}: held-out row {item.item_id} repeats the question of train row "
                f"{seen[item.prompt]}; remove it from one of the files"
            )
    return TaskSource(f"jsonl({Path(train_path).name})", train, val)
