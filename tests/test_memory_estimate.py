"""`config show`'s memory estimate (control/memory.py) against shapes and measured peaks.

Peaks are measured as benchmarks/memory_profile.py measures them (RSS sampled through a run of
the recipe, in a fresh process), so the test and the benchmark read the same number.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from posttrain.config import from_yaml, load_config
from posttrain.control import memory
from posttrain.entrypoints.cli import main
from posttrain.model.gguf_import import smollm2_dir
from posttrain.model.lora import apply_lora
from posttrain.model.tiny import count_parameters, tiny_config

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = smollm2_dir()


@pytest.mark.parametrize("preset", ["tiny", "small", "arith"])
def test_parameter_counts_equal_the_built_models(preset):
    config = tiny_config(preset)
    shape = memory.ModelShape.from_config(config.to_dict())
    model = LlamaForCausalLM(config)
    assert shape.parameters() == count_parameters(model)
    targets = ["q_proj", "v_proj", "down_proj"]
    lora = apply_lora(model, 4, 8.0, targets, seed=0)
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert shape.lora_parameters(4, targets) == trainable


def test_token_budget_sizes_the_micro_batch():
    cfg = load_config("arithmetic", ["--", "rl.micro_batch_size=64"])
    assert memory.micro_batch(cfg, 5) == (64, 64 * 9)  # rows x (prompt + max_tokens 4)
    cfg = load_config("arithmetic", ["--", "rl.micro_batch_tokens=100"])
    assert memory.micro_batch(cfg, 5) == (11, 99)


def test_checkpointing_and_sharing_lower_the_activation_estimate():
    shape = memory.ModelShape.from_config(tiny_config("small").to_dict())

    def activations(*opts: str) -> float:
        cfg = load_config("arithmetic", ["--", "rl.micro_batch_size=16", *opts])
        parts = memory.estimate(cfg, shape, prompt_tokens=60)
        return next(p.bytes for p in parts if p.name.startswith("activations"))

    full = activations("rl.shared_prefix=off")
    assert activations() < full  # 8 rows of a group share their prompt
    assert activations("model.gradient_checkpointing=true") < full / 3


def test_config_show_prints_the_estimate_as_yaml_comments(capsys):
    assert main(["config", "show", "--config", "arithmetic"]) == 0
    out, err = capsys.readouterr()
    assert from_yaml(out) == load_config("arithmetic", ["--"])
    lines = [x for x in out.splitlines() if x.startswith("# ")]
    assert lines[0].startswith("# memory estimate (cpu, prompts up to ")
    for part in ("policy:", "gradients:", "optimizer state:", "activations", "logits",
                 "KV cache", "peak (one process"):  # fmt: skip
        assert any(part in x for x in lines), part


def _measured(tmp_path: Path, config: str, overrides: list[str], threads: int = 1) -> dict:
    out = tmp_path / "profile.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "memory_profile.py"), "--config", config,
           "--threads", str(threads), "--json", str(out), "--", *overrides]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run(cmd, check=True, cwd=tmp_path, env=env, capture_output=True, timeout=900)
    return json.loads(out.read_text())


def _check(tmp_path: Path, config: str, overrides: list[str], threads: int = 1) -> None:
    measured = _measured(tmp_path, config, overrides, threads)
    cfg = load_config(config, ["--", *overrides])
    if not Path(cfg.model.name_or_path).is_absolute():  # the run built it under tmp_path
        cfg = load_config(
            config, ["--", *overrides, f"model.name_or_path={tmp_path / cfg.model.name_or_path}"]
        )
    estimate = memory.peak(memory.estimate(cfg, memory.model_shape(cfg), memory.prompt_tokens(cfg)))
    ratio = estimate / measured["peak"]
    assert 0.75 <= ratio <= 1.25, (estimate / 1e6, measured["peak"] / 1e6)


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_estimate_is_within_a_quarter_of_the_measured_peak(tmp_path, preset):
    torch.set_num_threads(1)
    _check(tmp_path, "arithmetic", [f"model.init_preset={preset}", "rl.max_steps=2",
                                    f"model.name_or_path=models/{preset}"])  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(not (SMOLLM2 / "config.json").is_file(), reason=f"no model at {SMOLLM2}")
def test_smollm2_recipe_estimate_is_within_a_quarter_of_its_measured_peak(tmp_path):
    # Needs about 5 GB and two minutes: run it under flock /tmp/heavy.lock.
    _check(tmp_path, "smollm2_reasoning_gym", [f"model.name_or_path={SMOLLM2}", "rl.max_steps=1"],
           threads=2)  # fmt: skip
