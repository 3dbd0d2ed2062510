"""The selection rule of ``posttrain rft`` (``data/rft.py``) by hand: which samples become SFT
rows and which pairs, pass@k, and the prompt part of a row (torch-free)."""

from __future__ import annotations

import pytest

from posttrain.config.sections import DataConfig
from posttrain.data.rft import Sample, pair_row, pass_at, pass_at_k, prompt_fields, select, sft_row
from posttrain.data.tasks import TaskItem
from posttrain.fileio import write_files_as_folder

#: One prompt's samples: (text, correct).
GROUP = [("7", True), ("8", False), ("7", True), ("9", False), ("8", False), (" 7", True)]


def samples(group=GROUP) -> list[Sample]:
    return [Sample(text, ok, float(ok)) for text, ok in group]


def test_distinct_correct_texts_become_rows_and_pair_in_order():
    s = select(samples(), per_prompt=None, dedup=True)
    assert s.rows == ["7", " 7"] and s.duplicates == 1
    assert s.pairs == [("7", "8"), (" 7", "9")]  # i-th distinct correct vs i-th distinct wrong


def test_the_cap_bounds_rows_and_pairs_per_prompt():
    s = select(samples(), per_prompt=1, dedup=True)
    assert s.rows == ["7"] and s.pairs == [("7", "8")]


def test_kept_duplicates_each_enter_once():
    s = select(samples(), per_prompt=None, dedup=False)
    assert s.rows == ["7", "7", " 7"] and s.duplicates == 0
    assert s.pairs == [("7", "8"), ("7", "9"), (" 7", "8")]


@pytest.mark.parametrize("ok", [True, False])
def test_a_prompt_all_right_or_all_wrong_gives_no_pair(ok):
    s = select(samples([("1", ok), ("2", ok)]), per_prompt=None, dedup=True)
    assert s.pairs == [] and s.rows == (["1", "2"] if ok else [])


def test_a_pair_never_holds_one_text_twice():
    # a reward that is not a function of the text alone can score one text both ways
    s = select(samples([("5", True), ("5", False), ("6", True), ("4", False)]), None, dedup=False)
    assert s.pairs == [("6", "4")]


def test_pass_at_k_is_the_unbiased_estimate():
    assert pass_at_k(4, 1, 1) == 0.25 and pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(8, 2, 2) == pytest.approx(1 - (6 * 5) / (8 * 7))
    assert pass_at(6, [0, 6, 3]) == pytest.approx(
        {"1": 0.5, "2": (0 + 1 + (1 - 3 * 2 / (6 * 5))) / 3, "4": (0 + 1 + 1) / 3, "6": 2 / 3}
    )


def test_rows_carry_the_prompt_the_rollout_rendered():
    item = TaskItem("3+4=", "7")
    plain = prompt_fields(item, DataConfig(prompt_template="plain", user_template="Q {prompt}"))
    assert sft_row(plain, "7") == {"prompt": "Q 3+4=", "completion": "7"}
    assert pair_row(plain, "7", "8") == {"prompt": "Q 3+4=", "chosen": "7", "rejected": "8"}
    chat = prompt_fields(item, DataConfig(prompt_template="chat", system_prompt="Be brief."))
    assert sft_row(chat, "7") == {"messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "3+4="},
        {"role": "assistant", "content": "7"}]}  # fmt: skip
    bare = prompt_fields(item, DataConfig(prompt_template="chat", system_prompt=None))
    assert pair_row(bare, "7", "8")["messages"] == [{"role": "user", "content": "3+4="}]


def test_the_folder_is_replaced_whole_or_not_at_all(tmp_path):
    out = tmp_path / "rft"
    write_files_as_folder(out, {"a.jsonl": "1\n", "summary.json": "{}\n"})
    assert sorted(p.name for p in out.iterdir()) == ["a.jsonl", "summary.json"]

    def refuse():
        raise RuntimeError("not now")

    with pytest.raises(RuntimeError):
        write_files_as_folder(out, {"a.jsonl": "2\n"}, before_replace=refuse)
    assert (out / "a.jsonl").read_text() == "1\n" and (out / "summary.json").exists()
    write_files_as_folder(out, {"a.jsonl": "3\n"})
    assert sorted(p.name for p in out.iterdir()) == ["a.jsonl"]
    assert (out / "a.jsonl").read_text() == "3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rft"]  # no temporary folder left
