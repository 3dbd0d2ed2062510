"""SFT rows (data/sft.py): the loss mask is the rendering's assistant spans, fallbacks say what
they do, and every bad row is one line naming file:line before anything trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.data.sft import SFTDataError, collate, load_sft
from posttrain.env.chat_template import build_tools_tokenizer
from posttrain.model.tokenizer import build_char_tokenizer

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "12+7?"},
    {"role": "assistant", "content": "<tool_call>12+7</tool_call>"},
    {"role": "tool", "content": "19"},
    {"role": "assistant", "content": "19"},
]


def write(tmp_path: Path, *rows, name="rows.jsonl") -> str:
    path = tmp_path / name
    path.write_bytes(b"".join(r if isinstance(r, bytes) else (json.dumps(r) + "\n").encode()
                              for r in rows))  # fmt: skip
    return str(path)


def trained_text(tok, row) -> str:
    """The row's text with every untrained token shown as ``·``."""
    return "".join(
        tok.convert_ids_to_tokens(i) if m else "·" for i, m in zip(row.ids, row.mask, strict=True)
    )


def test_the_mask_is_every_assistant_span_with_its_stop_token(tmp_path):
    tok = build_tools_tokenizer()
    data = load_sft(write(tmp_path, {"messages": CONVERSATION, "tools": TOOLS}), tok, 200, "error")
    (row,) = data.rows
    text = tok.decode(row.ids)
    assert text == tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False).rstrip("\n")
    shown = trained_text(tok, row).replace("·", " ").split()
    assert shown == ["<tool_call>12+7</tool_call><eos>", "19<eos>"] and data.fallback is None


def test_an_assistant_turn_of_weight_0_is_context(tmp_path):
    """OpenAI's ``weight``: 0 leaves the turn in the text, out of the loss (a worked example
    before the question); the ids are those of the row without the key."""
    tok = build_tools_tokenizer()
    example = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]
    plain = {"messages": [*example, *CONVERSATION[1:]], "tools": TOOLS}
    weighted = {"messages": [example[0], {**example[1], "weight": 0}, *CONVERSATION[1:]],
                "tools": TOOLS}  # fmt: skip
    both = load_sft(write(tmp_path, plain, weighted), tok, 300, "error").rows
    assert both[0].ids == both[1].ids and "weight" not in tok.decode(both[1].ids)
    assert trained_text(tok, both[0]).replace("·", " ").split()[0] == "2<eos>"
    shown = trained_text(tok, both[1]).replace("·", " ").split()
    assert shown == ["<tool_call>12+7</tool_call><eos>", "19<eos>"]


def test_prompt_completion_rows_and_the_no_template_fallback(tmp_path):
    path = write(tmp_path, {"prompt": "2+2=", "completion": "4"})
    (row,) = load_sft(path, build_tools_tokenizer(), 50, "error").rows
    assert trained_text(build_tools_tokenizer(), row).strip("·") == "4<eos>"
    plain = build_char_tokenizer()
    assert plain.chat_template is None
    data = load_sft(path, plain, 50, "error")
    assert plain.decode(data.rows[0].ids) == "<bos>2+2=4<eos>"
    assert trained_text(plain, data.rows[0]).strip("·") == "4<eos>"
    assert "no chat template" in data.fallback and "\n" not in data.fallback
    with pytest.raises(SFTDataError, match=r"rows.jsonl:1: the tokenizer has no chat template"):
        load_sft(write(tmp_path, {"messages": CONVERSATION}), plain, 200, "error")


def test_a_template_that_rewrites_earlier_turns_trains_the_last_turn_only(tmp_path):
    tok = build_tools_tokenizer()
    # Drops earlier assistant turns once a later one exists (as reasoning templates do).
    tok.chat_template = (
        "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}"
        "{{ m.role[0] | upper }}:{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}A:{% endif %}"
    )
    data = load_sft(write(tmp_path, {"messages": CONVERSATION}), tok, 200, "error")
    assert trained_text(tok, data.rows[0]).strip("·") == "19<eos>"
    assert "rows.jsonl:1: the chat template rewrites earlier turns" in data.fallback


def test_a_template_whose_turns_do_not_end_with_eos_is_refused(tmp_path):
    """The span would run on past the turn into the separator, and never hold the stop token a
    rollout stops at: the model would not learn to stop."""
    tok = build_tools_tokenizer()
    tok.chat_template = tok.chat_template.replace("{{ eos_token }}", "|")
    with pytest.raises(SFTDataError) as info:
        load_sft(write(tmp_path, {"messages": CONVERSATION}), tok, 200, "error")
    assert (
        "rows.jsonl:1: the chat template closes an assistant turn without the tokenizer's "
        "EOS '<eos>'"
        in str(info.value)
        and "\n" not in str(info.value)
    )


def test_the_last_turn_fallback_is_per_row(tmp_path):
    tok = build_tools_tokenizer()
    # Drops an earlier assistant turn only when it holds reasoning (as Qwen3's template does).
    tok.chat_template = (
        "{% for m in messages %}{% if m.role != 'assistant' or loop.last or '<' not in m.content %}"
        "{{ m.role[0] | upper }}:{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}A:{% endif %}"
    )
    plain = [{**m, "content": "12+7"} if m["role"] == "assistant" and i == 2 else m
             for i, m in enumerate(CONVERSATION)]  # fmt: skip
    data = load_sft(write(tmp_path, {"messages": plain}, {"messages": CONVERSATION}), tok, 200,
                    "error")  # fmt: skip
    assert trained_text(tok, data.rows[0]).replace("·", " ").split() == ["12+7<eos>", "19<eos>"]
    assert trained_text(tok, data.rows[1]).strip("·") == "19<eos>"
    assert data.fallback.startswith(f"{tmp_path / 'rows.jsonl'}:2: the chat template rewrites")


def test_tool_calls_are_rendered_by_the_template_and_their_arguments_parsed(tmp_path):
    tok = build_tools_tokenizer()
    tok.chat_template = tok.chat_template.replace(
        "{{ m.content }}{{ eos_token }}",
        "{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}"
        "{{ c.function.arguments.x }}</tool_call>{% endfor %}{{ eos_token }}",
    )
    call = {"type": "function", "function": {"name": "calc", "arguments": '{"x": "12+7"}'}}
    messages = [CONVERSATION[1], {"role": "assistant", "content": None, "tool_calls": [call]}]
    (row,) = load_sft(write(tmp_path, {"messages": messages}), tok, 200, "error").rows
    assert trained_text(tok, row).strip("·") == "<tool_call>calc12+7</tool_call><eos>"
    # The tiny template does not render tool_calls: refused rather than trained on nothing.
    with pytest.raises(SFTDataError, match="does not render assistant tool_calls"):
        load_sft(write(tmp_path, {"messages": messages}), build_tools_tokenizer(), 200, "error")


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "rows.jsonl:2: no assistant turn"),
        ({"messages": [{"role": "user", "content": "hi"},
                       {"role": "assistant", "content": "x", "weight": 0}]},
         "rows.jsonl:2: no assistant turn of weight 1"),
        ({"messages": [{"role": "user", "content": "hi", "weight": 0},
                       {"role": "assistant", "content": "x"}]},
         "rows.jsonl:2: message 0 has \"weight\" 0; only an assistant turn takes one"),
        ({"messages": [{"role": "user", "content": "hi"},
                       {"role": "assistant", "content": "x", "weight": 0.5}]},
         "rows.jsonl:2: message 1 has \"weight\" 0.5"),
        ({"messages": [{"role": "user", "content": "hi"},
                       {"role": "assistant", "content": "x", "weight": True}]},
         "rows.jsonl:2: message 1 has \"weight\" True"),
        ({"messages": [{"role": "robot", "content": "hi"}, {"role": "assistant", "content": "x"}]},
         "rows.jsonl:2: message 0 has role 'robot', which the chat template does not know"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
          "tool_calls": [{"function": {"name": "calc", "arguments": "{x: 1"}}]}]},
         "rows.jsonl:2: message 1 tool call 0: arguments are not valid JSON"),
        (b"\xff\xfe not utf-8\n", "rows.jsonl:2: not UTF-8"),
        (b"{not json\n", "rows.jsonl:2: not valid JSON"),
        ([1, 2], "rows.jsonl:2: expected a JSON object, got list"),
        ({"question": "q"}, "rows.jsonl:2: a row needs \"messages\""),
        ({"prompt": "1+1=", "completion": "2" * 80}, "rows.jsonl:2: the row renders to"),
    ],
)  # fmt: skip
def test_a_bad_row_is_one_line_naming_file_and_line(tmp_path, row, fragment):
    good = {"prompt": "1+1=", "completion": "2"}
    with pytest.raises(SFTDataError) as info:
        load_sft(write(tmp_path, good, row, good), build_tools_tokenizer(), 40, "error")
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_over_long_rows_drop_or_truncate(tmp_path):
    tok = build_tools_tokenizer()
    path = write(tmp_path, {"prompt": "1+1=", "completion": "2"},
                 {"prompt": "1+1=", "completion": "2" * 30}, {"prompt": "1" * 30, "completion": "2"})  # fmt: skip
    dropped = load_sft(path, tok, 20, "drop")
    assert len(dropped.rows) == 1 and dropped.dropped == 2
    cut = load_sft(path, tok, 20, "truncate")  # the third keeps no assistant token: dropped
    assert [len(r.ids) for r in cut.rows] == [len(dropped.rows[0].ids), 20] and cut.dropped == 1


def test_collate_puts_the_first_token_in_the_prompt_and_the_mask_after_it(tmp_path):
    tok = build_tools_tokenizer()
    data = load_sft(write(tmp_path, {"prompt": "1+1=", "completion": "2"},
                          {"messages": CONVERSATION}), tok, 200, "error")  # fmt: skip
    batch = collate(data.rows, pad_id=tok.pad_token_id)
    assert (
        batch.prompt_width == 1 and batch.response_width == max(len(r.ids) for r in data.rows) - 1
    )
    for b, r in enumerate(data.rows):
        assert batch.input_ids[b, : len(r.ids)].tolist() == r.ids
        assert batch.response_mask[b, : len(r.ids) - 1].tolist() == r.mask[1:]
        assert not batch.response_mask[b, len(r.ids) - 1 :].any()
