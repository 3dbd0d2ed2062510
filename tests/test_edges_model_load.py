"""Issue 24 item 10: DPO timesteps beyond the model's schedule, and weights holding NaN/inf."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from posttrain.entrypoints.cli import EXIT_CONFIG_ERROR, main
from posttrain.model.errors import ModelLoadError
from posttrain.model.loading import load_policy
from posttrain.model.tiny import build_tiny_model


@pytest.fixture
def pipeline():
    """A pipeline folder's schedule (T = 1000, as ``new_scheduler`` writes); the rule reads
    nothing else."""
    return Path(__file__).parent / "fixtures" / "dpo_schedule"


def _show(capsys, pipeline, *opts: str) -> tuple[int, str]:
    code = main(["config", "show", "--config", "dpo_shapes", "--",
                 f"model.name_or_path={pipeline}", *opts])  # fmt: skip
    return code, capsys.readouterr().err


def test_min_timestep_beyond_the_schedule_fails_config_show(capsys, pipeline):
    code, err = _show(capsys, pipeline, "dpo.min_timestep=5000")
    assert code == EXIT_CONFIG_ERROR and err.count("\n") == 1, err
    assert "dpo.min_timestep=5000 exceeds the model's schedule of 1000 training timesteps" in err
    assert "use dpo.min_timestep in 0..999 and dpo.sample_steps in 1..1000" in err


def test_sample_steps_beyond_the_schedule_fail_too(capsys, pipeline):
    code, err = _show(capsys, pipeline, "dpo.min_timestep=1000", "dpo.sample_steps=1001")
    assert code == EXIT_CONFIG_ERROR
    assert "dpo.min_timestep=1000 and dpo.sample_steps=1001 exceed the model's schedule" in err


def test_timesteps_inside_the_schedule_pass(capsys, pipeline, tmp_path):
    pairs = tmp_path / "pairs.jsonl"  # config show also checks that the manifest exists
    pairs.write_text("")
    code, err = _show(
        capsys, pipeline, "dpo.min_timestep=999", "dpo.sample_steps=1000", f"dpo.pairs_path={pairs}"
    )
    assert code == 0, err


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_weights_holding_nan_or_inf_are_refused_naming_the_tensor(tmp_path, bad):
    folder = build_tiny_model("arith", tmp_path / "m")
    weights = load_file(folder / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    weights[name][3, 4] = bad
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError) as e:
        load_policy(folder)
    assert f"tensor {name} holds NaN or inf (1 of {weights[name].numel()} values)" in str(e.value)


def test_finite_weights_load(tmp_path):
    model, _ = load_policy(build_tiny_model("arith", tmp_path / "m"))
    assert all(torch.isfinite(p).all() for p in model.parameters())
