"""benchmarks/copy_probe.py: its problem files, its copy reward and its full-attention twin."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("copy_probe", REPO / "benchmarks/copy_probe.py")
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


def test_problems_hold_the_context_around_the_right_aligned_sum(tmp_path) -> None:
    probe.write_problems("tool", tmp_path)
    val = [json.loads(line) for line in (tmp_path / "val.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(val) == 100 and len(train) == 20000
    assert not {r["question"] for r in val} & {r["question"] for r in train}
    q, answer = val[0]["question"], val[0]["answer"].removeprefix("#### ")
    a, b = q.removeprefix("U:").split("=")[0].split("+")
    assert int(a) + int(b) == int(answer)
    assert q.endswith(f"<tool_response>{answer.rjust(4)}</tool_response><eos>\nA:")


def test_prefix_reward_pays_copied_characters_and_the_stop() -> None:
    assert probe.prefix_reward("", " 579", "579", {}) == 0.0  # exact: the verifier pays
    assert probe.prefix_reward("", " 578", "579", {}) == pytest.approx(0.8 * 3 / 4 + 0.2)
    assert probe.prefix_reward("", " 57", "579", {}) == pytest.approx(0.8 * 3 / 4)
    assert probe.prefix_reward("", "1234", "579", {}) == pytest.approx(0.2)


def test_the_full_attention_twin_has_the_presets_weights_without_the_window(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from posttrain.model.tiny import build_tiny_model, count_parameters

    full = AutoModelForCausalLM.from_pretrained(probe.full_attention_model(tmp_path / "full"))
    window = AutoModelForCausalLM.from_pretrained(build_tiny_model("arith_tools", tmp_path / "w"))
    assert full.config.model_type == "llama" and window.config.sliding_window == 10
    assert count_parameters(full) == count_parameters(window) == 135232
    weights = window.state_dict()
    assert full.state_dict().keys() == weights.keys()
    for name, p in full.state_dict().items():
        assert torch.equal(p, weights[name]), name  # the same seed, the same layers
