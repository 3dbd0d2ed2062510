"""Preference pairs (data/lmdpo.py): rendered as SFT rows are, the answer's turn alone carries
the log-prob sum, and ``lmdpo.truncation=drop`` leaves over-long pairs out."""

from __future__ import annotations

import json

from posttrain.data.lmdpo import collate_pairs, last_turn_only, load_pairs
from posttrain.data.sft import render_row
from posttrain.model.tiny import preset_tokenizer


def test_only_the_answers_turn_is_marked_and_rendering_is_the_sft_one(tmp_path):
    tok = preset_tokenizer("arith_tools")
    history = [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"},
               {"role": "user", "content": "4+5="}]  # fmt: skip
    row = {"messages": history, "chosen": {"role": "assistant", "content": "9"}, "rejected": "8"}
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(row) + "\n")
    ((chosen, rejected),) = load_pairs(str(path), tok, 64, "error").pairs
    ids, mask, _ = render_row(tok, [*history, {"role": "assistant", "content": "9"}], [])
    assert chosen.ids == ids and chosen.mask == last_turn_only(mask) != mask  # the "3" is context
    runs = sum(1 for i, m in enumerate(chosen.mask) if m and (i == 0 or not chosen.mask[i - 1]))
    assert runs == 1 and rejected.ids[: mask.index(True)] == ids[: mask.index(True)]
    batch = collate_pairs([(chosen, rejected)], pad_id=0)
    assert batch.group_ids.tolist() == [0, 0] and batch.columns["lmdpo_chosen"].tolist() == [
        True, False]  # fmt: skip


def test_drop_leaves_over_long_pairs_out(tmp_path):
    tok = preset_tokenizer("arith_tools")
    path = tmp_path / "p.jsonl"
    rows = [{"prompt": "1+2=", "chosen": "3", "rejected": "4"},
            {"prompt": "1+2=", "chosen": "3" * 80, "rejected": "4"}]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_pairs(str(path), tok, 40, "drop")
    assert len(data.pairs) == 1 and data.dropped == 1
