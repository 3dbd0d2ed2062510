"""GSM8K-format JSONL reader: fixture rows, malformed rows named by file and line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from posttrain.data.tasks import TaskDataError, make_task_source, read_gsm8k_jsonl

FIXTURES = Path(__file__).parent / "fixtures"
TRAIN, VAL = FIXTURES / "gsm8k_train.jsonl", FIXTURES / "gsm8k_val.jsonl"


def test_reads_fixture_rows():
    items = read_gsm8k_jsonl(TRAIN)
    assert [it.answer for it in items] == ["19", "15", "35", "1550", "-5"]
    assert items[0].prompt.startswith("Mira has 4 boxes")
    assert items[0].meta["solution"].endswith("#### 19")
    # The blank line 4 is skipped, and ids keep the file's own line numbers.
    assert [it.item_id for it in items] == [f"gsm8k_train.jsonl:{n}" for n in (1, 2, 3, 5, 6)]


def test_factory_builds_train_and_val():
    src = make_task_source("jsonl", train_path=str(TRAIN), val_path=str(VAL))
    assert len(src) == 5
    assert [it.answer for it in src.val_items()] == ["108", "7.5"]
    assert make_task_source("jsonl", train_path=TRAIN).val_items() == []
    with pytest.raises(ValueError, match="needs train_path"):
        make_task_source("jsonl", val_path=VAL)


GOOD = {"question": "Q?", "answer": "work\n#### 3"}


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        (json.dumps({"answer": "#### 3"}), "missing field 'question'"),
        (json.dumps({"question": "Q?"}), "missing field 'answer'"),
        (json.dumps({"question": 5, "answer": "#### 3"}), "'question' must be a non-empty string"),
        (json.dumps({"question": "  ", "answer": "#### 3"}), "'question' must be a non-empty"),
        (json.dumps({"question": "Q?", "answer": "3"}), "no final '#### N' line"),
        (
            json.dumps({"question": "Q?", "answer": "x\n#### three"}),
            "must be a number, got 'three'",
        ),
        (json.dumps({"question": "Q?", "answer": "x\n####"}), "must be a number, got ''"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path, line, needle):
    p = tmp_path / "data.jsonl"
    p.write_text(json.dumps(GOOD) + "\n\n" + line + "\n" + json.dumps(GOOD) + "\n")
    with pytest.raises(TaskDataError, match=re.escape(f"{p}:3: ") + ".*" + re.escape(needle)):
        read_gsm8k_jsonl(p)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(TaskDataError, match="no such file"):
        read_gsm8k_jsonl(tmp_path / "nope.jsonl")
    (tmp_path / "e.jsonl").write_text("\n  \n")
    with pytest.raises(TaskDataError, match="no rows"):
        read_gsm8k_jsonl(tmp_path / "e.jsonl")


def test_held_out_question_repeated_in_train_is_an_error(tmp_path):
    val = tmp_path / "val.jsonl"
    rows = [read_gsm8k_jsonl(VAL)[0], read_gsm8k_jsonl(TRAIN)[2]]
    val.write_text(
        "".join(
            json.dumps({"question": r.prompt, "answer": r.meta["solution"]}) + "\n" for r in rows
        )
    )
    with pytest.raises(
        TaskDataError, match=r"val\.jsonl:2 repeats the question of train row gsm8k_train\.jsonl:3"
    ):
        make_task_source("jsonl", train_path=TRAIN, val_path=val)
