"""The end of a run writes ``RUN_DIR/final_model``, a plain Hugging Face folder, from its final
checkpoint (``checkpoint.export_final``), atomically; ``posttrain model export`` is the same
export for any checkpoint. The sharded (two FSDP Ray ranks) case is in
``test_fsdp_ray.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_here import posttrain_here
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from posttrain.config import ConfigError, load_config
from posttrain.config.build import build_objective
from posttrain.entrypoints import grpo
from posttrain.model.tiny import build_tiny_model
from posttrain.run.records import FINAL_DIR
from posttrain.trainer.export import MARKER, export_hf, exported_step

REPO = Path(__file__).resolve().parents[1]
STEPS = 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def opts_for(root: Path, model: Path, **extra) -> list[str]:
    opts = {
        "job.output_root": str(root), "model.name_or_path": str(model), "data.train_size": 40,
        "data.val_size": 4, "data.prompts_per_step": 2, "rollout.n": 4, "rollout.max_tokens": 3,
        "rl.lr": 0.01, "rl.max_steps": STEPS, "rl.save_every": 0, "rl.eval_every": 0,
        "rl.micro_batch_size": 8, "logging.progress": False,
        "reward.functions": "[role_fixtures:digit_reward]", **extra,
    }  # fmt: skip
    return [f"{k}={v}" for k, v in opts.items()]


def train(opts: list[str]) -> Path:
    config = load_config("arithmetic", ["--", *opts])
    summary = grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config), build_objective)
    return Path(summary["run_dir"])


def final_ckpt(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / f"step_{STEPS:08d}"


def loaded(folder: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).state_dict()


@pytest.fixture(scope="module")
def runs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {
        "full": train(opts_for(root, tiny, **{"job.name": "full"})),
        "lora": train(opts_for(root, tiny, **{"job.name": "lora", "model.lora_rank": 4,
                                              "model.lora_target_modules": "[q_proj,v_proj]"})),
    }  # fmt: skip


def test_a_replicated_run_ends_with_its_final_weights_as_a_linked_folder(runs, tiny):
    run_dir = runs["full"]
    model_dir = final_ckpt(run_dir) / "model"
    want = load_file(str(model_dir / "model.safetensors"))
    got = loaded(run_dir / FINAL_DIR)
    assert all(torch.equal(got[k], v) for k, v in want.items())
    initial = load_file(str(tiny / "model.safetensors"))
    assert any(not torch.equal(want[k], initial[k]) for k in want)  # it trained
    # The same bytes once on disk: hard links to the checkpoint's files.
    for f in model_dir.iterdir():
        assert os.path.samefile(f, run_dir / FINAL_DIR / f.name), f.name
    assert not list(run_dir.glob(".tmp-*"))


def test_a_lora_run_ends_with_the_adapters_merged_as_peft_merges_them(runs, tiny):
    from peft import PeftModel

    from posttrain.model.lora import merged_state

    run_dir = runs["lora"]
    base = AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True)
    peft_model = PeftModel.from_pretrained(base, final_ckpt(run_dir) / "model")
    want = merged_state(peft_model)
    got = loaded(run_dir / FINAL_DIR)
    assert not any("lora" in k for k in got) and set(want) <= set(got)
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    assert not torch.equal(want["model.layers.0.self_attn.q_proj.weight"],
                           base.state_dict()["model.layers.0.self_attn.q_proj.base_layer.weight"])  # fmt: skip


def test_export_final_false_writes_no_folder(tiny, tmp_path):
    run_dir = train(
        opts_for(tmp_path, tiny, **{"checkpoint.export_final": False, "rl.max_steps": 1})
    )
    assert (run_dir / "checkpoints" / "step_00000001" / "COMPLETE").exists()
    assert not (run_dir / FINAL_DIR).exists()


def test_export_final_takes_a_bool_only():
    with pytest.raises(ConfigError) as e:
        load_config("arithmetic", ["--", "checkpoint.export_final=maybe"])
    assert "checkpoint.export_final" in str(e.value) and "\n" not in str(e.value)


KILLER = """
import os, signal, sys
import posttrain.trainer.dcp as dcp
from posttrain.trainer.export import export_final
real = dcp.save_file
def save_then_die(*a, **k):
    real(*a, **k)
    os.kill(os.getpid(), signal.SIGKILL)  # mid-export: one layer file written
dcp.save_file = save_then_die
export_final(sys.argv[1], sys.argv[2])
"""


def test_a_kill_during_export_leaves_no_half_folder_and_a_rerun_exports(runs, tiny, tmp_path):
    """SIGKILL after the first layer file: no ``final_model`` (or the previous one, intact),
    only the ``.tmp-final_model`` leftover; rerunning the finished command exports it."""
    run_dir = runs["lora"]
    before = {f.name: f.read_bytes() for f in (run_dir / FINAL_DIR).iterdir()}
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}"}
    args = [sys.executable, "-c", KILLER, str(final_ckpt(run_dir)), str(run_dir)]
    killed = subprocess.run(args, env=env, capture_output=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (run_dir / ".tmp-final_model").is_dir()  # the half export, beside, never in place
    assert {f.name: f.read_bytes() for f in (run_dir / FINAL_DIR).iterdir()} == before
    # No previous export at all: the run directory has no final_model after the kill.
    os.rename(run_dir / FINAL_DIR, tmp_path / "previous")
    killed = subprocess.run(args, env=env, capture_output=True, timeout=120)
    assert killed.returncode == -9 and not (run_dir / FINAL_DIR).exists()
    # An export of an older step (not the final one) is redone by rerunning the complete
    # command, which also removes the leftover.
    os.rename(tmp_path / "previous", run_dir / FINAL_DIR)
    (run_dir / FINAL_DIR / MARKER).write_text('{"checkpoint": "step_00000001", "step": 1}')
    assert exported_step(run_dir / FINAL_DIR) == 1
    opts = opts_for(run_dir.parents[1], tiny, **{"job.name": "lora", "model.lora_rank": 4,
                                                 "model.lora_target_modules": "[q_proj,v_proj]"})  # fmt: skip
    again = posttrain_here(["grpo", "--config", "arithmetic", "--", *opts], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already complete" in again.stdout and "final model" in again.stdout
    assert not (run_dir / ".tmp-final_model").exists()
    assert {f.name: f.read_bytes() for f in (run_dir / FINAL_DIR).iterdir()} == before
    assert exported_step(run_dir / FINAL_DIR) == STEPS


def test_a_failed_export_is_one_line_naming_the_checkpoint(tiny, tmp_path):
    base = build_tiny_model("tiny", tmp_path / "base", seed=0)
    lora = {"job.name": "gone", "model.lora_rank": 2, "model.lora_target_modules": "[q_proj]",
            "rl.max_steps": 1, "checkpoint.export_final": False}  # fmt: skip
    run_dir = train(opts_for(tmp_path / "out", base, **lora))
    os.rename(base, tmp_path / "moved")  # the base model the adapters need is gone
    out = posttrain_here(["model", "export", str(run_dir / "checkpoints" / "step_00000001"),
                          "--out", str(tmp_path / "hf")], tmp_path)  # fmt: skip
    err = out.stderr.strip()
    assert out.returncode == 2 and "\n" not in err and "not a model folder here" in err, err
    from posttrain.trainer.errors import CheckpointError
    from posttrain.trainer.export import export_final

    with pytest.raises(CheckpointError) as e:
        export_final(run_dir / "checkpoints" / "step_00000001", run_dir)
    msg = str(e.value)
    assert "step_00000001 is complete" in msg and "posttrain model export" in msg
    assert "\n" not in msg and not (run_dir / FINAL_DIR).exists()
    assert not list(run_dir.glob(".tmp-*"))


def test_model_export_takes_any_checkpoint_and_refuses_a_used_folder(runs, tmp_path, capsys):
    from posttrain.model.cli import main

    ckpt = final_ckpt(runs["full"])
    assert main(["export", str(ckpt), "--out", str(tmp_path / "hf")]) == 0
    got = loaded(tmp_path / "hf")
    want = load_file(str(ckpt / "model" / "model.safetensors"))
    assert all(torch.equal(got[k], v) for k, v in want.items())
    capsys.readouterr()
    assert main(["export", str(ckpt), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert "already exists and is not empty" in err and "\n" not in err
    assert export_hf(ckpt, tmp_path / "hf", replace=True) == tmp_path / "hf"


def test_model_export_of_a_missing_checkpoint_says_it_is_missing(runs, tmp_path, capsys):
    """A well-formed ``step_NNNNNNNN`` name whose folder is gone is reported as missing (with the
    checkpoints that are there), not as a badly named directory."""
    from posttrain.model.cli import main

    gone = runs["full"] / "checkpoints" / "step_00000099"
    assert main(["export", str(gone), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{gone} does not exist" in err, err
    assert f"holds the complete checkpoints step_{STEPS:08d}" in err, err
    assert "step_NNNNNNNN" not in err and not (tmp_path / "hf").exists()


def test_merging_adapters_records_no_autograd_graph(tmp_path, monkeypatch):
    """The LoRA merge reads and sums whole weight matrices: it runs under ``torch.no_grad``."""
    import posttrain.trainer.export as export

    modes = []

    def scale(cfg: dict) -> float:
        modes.append(torch.is_grad_enabled())
        raise RuntimeError("stop after the first step")

    monkeypatch.setattr(export, "lora_scale", scale)
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(RuntimeError, match="stop after"):
        export._merge_adapters(tmp_path, tmp_path, tmp_path / "out")
    assert modes == [False]
