"""benchmarks/gpu_bench.py in smoke mode (CPU, tiny sizes), its ``--engine vllm`` settings that
need no vLLM process (the smoke run with vLLM is ``test_gpu_bench_vllm.py``), and the CUDA-only
device checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
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


def test_engine_vllm_without_vllms_interpreter_is_one_line():
    from posttrain.rollout.vllm_process import missing_vllm_message

    env = {**os.environ, "POSTTRAIN_VLLM_PYTHON": str(REPO / "no-such-python")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_bench.py"), "--smoke", "--engine", "vllm"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.strip() == missing_vllm_message() and not proc.stdout


#: vLLM's CPU attention's head sizes (``CPUAttentionBackend.get_supported_head_sizes``), from 32.
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def test_with_vllm_the_models_and_the_grpo_steps_preset_have_heads_vllm_takes(tmp_path):
    """Every ``--engine vllm`` model has a head size vLLM's CPU attention takes, and the GRPO
    step's overrides load as a ``rollout.engine=vllm`` run of a preset with such heads."""
    import gpu_bench

    from posttrain.config import load_config
    from posttrain.model.presets import preset_config
    from posttrain.rollout.vllm_engine import VllmOptions

    options = VllmOptions(dtype="bfloat16", kv_cache_space_gib=16.0, enforce_eager=False)
    for smoke, shape in [(True, "smollm2"), (True, "qwen2.5-0.5b"), (False, "smollm2"),
                         (False, "qwen2.5-0.5b")]:  # fmt: skip
        s = gpu_bench.sizes(Namespace(smoke=smoke, engine="vllm", shape=shape))
        assert s["hidden"] // s["heads"] in VLLM_CPU_HEAD_SIZES, (smoke, shape)
        opts = gpu_bench.grpo_opts(s, torch.device("cpu"), tmp_path, options)
        config = load_config("arithmetic_clipped", ["--", *opts])
        assert (config.rollout.engine, config.rollout.dtype) == ("vllm", "bfloat16")
        assert (config.vllm.kv_cache_space_gib, config.vllm.enforce_eager) == (16.0, False)
        preset = preset_config(config.model.init_preset)
        assert preset["hidden_size"] // preset["num_attention_heads"] in VLLM_CPU_HEAD_SIZES
    qwen = gpu_bench.sizes(Namespace(smoke=False, engine="vllm", shape="qwen2.5-0.5b"))
    assert [qwen[k] for k in ("arch", "hidden", "layers", "heads", "kv", "ffn", "vocab")] == [
        "qwen2", 896, 24, 14, 2, 4864, 151936
    ]  # fmt: skip
    torch_smoke = gpu_bench.sizes(Namespace(smoke=True, engine="torch", shape="smollm2"))
    assert torch_smoke == gpu_bench.SMOKE  # without vLLM, the smoke sizes as before


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
