"""benchmarks/gpu_bench.py in smoke mode (CPU, tiny sizes), and the CUDA-only device checks."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_smoke_prints_the_table_and_writes_json(tmp_path, capsys):
    import gpu_bench

    out = tmp_path / "bench.json"
    result = gpu_bench.main(["--smoke", "--json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    for key in ("rollout_tok_s", "hf_generate_tok_s", "train_tok_s", "mfu", "grpo_step_s"):
        assert result[key] > 0, key
    assert result["device"] == "cpu"
    assert "rollout_ms_per_decode_step" in capsys.readouterr().out


@cuda
def test_local_roles_land_on_cuda_with_a_bf16_rollout_copy(tmp_path):
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.model.tiny import build_tiny_model
    from posttrain.placement.local import place_local

    model = build_tiny_model("tiny", tmp_path / "m", seed=0)
    opts = [f"model.name_or_path={model}", f"job.output_root={tmp_path}"]
    roles = place_local(load_config("arithmetic", ["--", *opts]), build_objective, str(tmp_path))
    assert next(roles.policy.model.parameters()).device.type == "cuda"
    engine_param = next(roles.rollout.engine.model.parameters())
    assert engine_param.device.type == "cuda" and engine_param.dtype == torch.bfloat16
    out = roles.rollout.generate([[1, 5, 6]], n=2, temperature=1.0, seed=0)
    assert out.batch.input_ids.device.type == "cpu"
