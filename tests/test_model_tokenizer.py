import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, PreTrainedTokenizerFast

from posttrain.model.tokenizer import (
    CHAR_LEVEL_MARKER,
    CHARACTERS,
    SPECIAL_TOKENS,
    build_char_tokenizer,
    char_vocab,
    is_char_level,
    load_tokenizer,
    save_char_tokenizer,
)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_special_ids_and_arithmetic_encoding(tok):
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    v = char_vocab()
    ids = tok("12+7=")["input_ids"]
    assert ids == [1, v["1"], v["2"], v["+"], v["7"], v["="]]
    assert tok.decode([v["1"], v["9"], tok.eos_token_id, 0], skip_special_tokens=True) == "19"
    assert len(tok) == len(v) == 4 + len(CHARACTERS)
    for ch in "0123456789+-*/=() abcXYZ.,!?":
        assert ch in v


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(CHARACTERS), max_size=40))
def test_round_trip_keeps_every_character(tok, text):
    # literal special-token strings ("<eos>") are matched as those tokens, by design of HF
    assume(not any(s in text for s in SPECIAL_TOKENS))
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text) + 1  # one token per character after <bos>
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_unknown_character_maps_to_unk(tok):
    assert tok("a€b", add_special_tokens=False)["input_ids"][1] == tok.unk_token_id


def test_saved_folder_is_marked_and_reloads_char_level(tmp_path, tok):
    save_char_tokenizer(tok, tmp_path)
    # a Llama config beside it must not swap in a different tokenizer class
    LlamaConfig(vocab_size=len(tok)).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())[CHAR_LEVEL_MARKER]
    assert is_char_level(tmp_path)
    back = load_tokenizer(tmp_path)
    assert isinstance(back, PreTrainedTokenizerFast)
    text = "what is 12 + 7 ? A: 19."
    assert back(text)["input_ids"] == tok(text)["input_ids"]
    assert back.decode(back(text)["input_ids"], skip_special_tokens=True) == text


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(ValueError, match="not valid JSON"):
        is_char_level(tmp_path)
    assert not is_char_level(tmp_path / "missing")
