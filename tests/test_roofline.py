"""benchmarks/roofline.py: the FLOP counts it divides by, and its smoke mode (seconds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from posttrain.config import load_config
from posttrain.model.tiny import build_tiny_model


def test_matmul_params_are_the_linear_weights_of_the_model(tmp_path):
    import roofline
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model("tiny", tmp_path / "m", seed=0)
    config = load_config("arithmetic", ["--", f"model.name_or_path={folder}"])
    model = AutoModelForCausalLM.from_pretrained(folder)
    linears = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert roofline.matmul_params(config) == linears


@pytest.mark.parametrize(
    ("opts", "update_per_param_token"),
    [
        ([], 6),  # legacy_pg, no KL: forward + backward
        (["rl.grpo_surrogate=clipped", "rl.kl_beta=0.1"], 8),  # + the reference forward
        (
            ["rl.grpo_surrogate=clipped", "rl.mini_batch_per_replica=2", "data.prompts_per_step=4"],
            8,
        ),  # + the π_old forward  # fmt: skip
        (["model.lora_rank=4", "rl.grpo_surrogate=clipped", "rl.kl_beta=0.1"], 6),  # 4 + ref
    ],
)
def test_phase_flops_count_each_forward_and_backward(opts, update_per_param_token):
    import roofline

    config = load_config("arithmetic", ["--", "rollout.n=4", *opts])
    row = {"perf/rollout_tokens_per_s": 50.0, "time/rollout_s": 2.0, "train/tokens": 180.0}
    flops = roofline.phase_flops(config, 1000, row)
    # 100 generated tokens; 80 prompt tokens over 4 samples each: 20 prefilled.
    assert flops["rollout"] == 2 * 1000 * (100 + 20)
    assert flops["update"] == update_per_param_token * 1000 * 180


def test_smoke_prints_the_table_and_writes_json(tmp_path, monkeypatch, capsys):
    import roofline

    monkeypatch.chdir(tmp_path)  # the tiny model is built under outputs/
    out = tmp_path / "roofline.json"
    result = roofline.main(["--smoke", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["peak_flop_per_s"]["float32"] > 0 and result["peak_flop_per_s"]["bfloat16"] > 0
    for name in ("rollout", "update"):
        phase = result["phases"][name]
        assert phase["dtype"] == "float32" and phase["flops"] > 0 and phase["of_peak"] > 0
    text = capsys.readouterr().out
    assert "matmul peak (64 x 64 x 64, 1 thread(s))" in text and "| update | float32 |" in text
