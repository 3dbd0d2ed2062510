"""The LM DPO entry end to end on the tiny recipe: the CLI trains and the held-out reward
accuracy rises, LoRA's adapter-free reference, resume (stop, SIGTERM and kill -9, bit-exact),
and its one-line user errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_entry_sft import _cli, rows_in, stops_then_resume

from posttrain.config import load_config
from posttrain.configs.lmdpo_tools_tiny import DATA, pairs
from posttrain.entrypoints import lmdpo

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
RECIPE = "lmdpo_tools_tiny"


def opts_for(root: Path, name: str, **extra) -> list[str]:
    opts = {
        "job.output_root": str(root / "out"),
        "job.name": name,
        "model.name_or_path": str(root / "model"),
        "lmdpo.train_path": str(REPO / DATA / "train.jsonl"),
        "lmdpo.val_path": str(REPO / DATA / "val.jsonl"),
        "rl.max_steps": 4,
        "rl.eval_every": 2,
        "rl.save_every": 2,
        "logging.progress": False,
    }
    opts.update(extra)
    return [f"{k}={v}" for k, v in opts.items()]


def train(opts: list[str]) -> dict:
    return lmdpo.run(load_config(RECIPE, ["--", *opts]), RECIPE, opts)


def test_the_fixture_files_are_the_recipes_pairs():
    for name, rows in zip(("train", "val"), pairs(), strict=True):
        text = (REPO / DATA / f"{name}.jsonl").read_text()
        assert text == "".join(json.dumps(r) + "\n" for r in rows)
    train_rows, val_rows = pairs()
    assert not {r["prompt"] for r in train_rows} & {r["prompt"] for r in val_rows}


def test_the_cli_trains_and_the_held_out_reward_accuracy_rises(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    code, _ = _cli(capsys, "lmdpo", "--config", RECIPE, "--",
                   *opts_for(tmp_path, "e2e", **{"rl.max_steps": 6, "rl.eval_every": 6}))  # fmt: skip
    assert code == 0
    run_dir = tmp_path / "out" / "lmdpo" / "e2e"
    metrics = rows_in(run_dir)
    assert sorted(metrics) == list(range(7))
    first, last = metrics[0], metrics[6]
    assert first["val/loss"] == pytest.approx(0.6931472, abs=1e-6)  # policy == reference
    assert first["val/rewards/accuracies"] == 0 and last["val/rewards/accuracies"] >= 0.9
    assert last["val/rewards/margins"] > 0 and last["val/loss"] < first["val/loss"]
    for k in ("chosen", "rejected", "accuracies", "margins"):
        assert f"train/rewards/{k}" in metrics[1]
    assert {"train/logps/chosen", "train/logps/rejected"} <= set(metrics[1])
    AutoModelForCausalLM.from_pretrained(run_dir / "final_model")
    saved = load_config(str(run_dir / "config.yaml"))
    assert saved.job.algorithm == "lmdpo" and saved.lmdpo.pairs_per_step == 8


def test_lora_scores_against_the_adapter_free_base(tmp_path):
    summary = train(opts_for(tmp_path, "lora", **{
        "model.lora_rank": 4, "model.lora_target_modules": "[q_proj,v_proj]",
        "rl.max_steps": 2, "rl.lr": 1e-2, "rl.micro_batch_tokens": 64, "lmdpo.loss": "ipo"}))  # fmt: skip
    # LoRA's B starts at zero: the policy is its base at step 0, so Δ = 0 and IPO's loss 1/(4β²)
    assert summary["initial"]["val/loss"] == pytest.approx(1 / (4 * 0.1**2), rel=1e-6)
    assert summary["final"]["val/loss"] < summary["initial"]["val/loss"]


def test_rpo_alpha_reaches_the_loss_and_the_held_out_loss(tmp_path):
    """``lmdpo.rpo_alpha=0.5``: at step 0 (policy == reference, DPO's part log 2) the held-out
    loss is log 2 + 0.5 x the chosen answers' NLL per token, which ``val/nll_loss`` reports."""
    summary = train(opts_for(tmp_path, "rpo", **{"lmdpo.rpo_alpha": 0.5, "rl.max_steps": 2}))
    first = summary["initial"]
    assert first["val/nll_loss"] > 0
    assert first["val/loss"] == pytest.approx(0.6931472 + 0.5 * first["val/nll_loss"], abs=1e-6)
    assert summary["final"]["val/loss"] < first["val/loss"]


def test_bf16_compute_scores_the_reference_in_the_same_precision(tmp_path):
    """``model.dtype=bfloat16``: the second copy of the base holds float32 weights, as the
    policy's master weights, and scores under the trainer's autocast as the policy does, so a
    policy equal to it still has Δ = 0 (loss log 2)."""
    summary = train(opts_for(tmp_path, "bf16", **{"model.dtype": "bfloat16", "rl.max_steps": 2}))
    metrics = rows_in(Path(summary["run_dir"]))
    assert summary["initial"]["val/loss"] == pytest.approx(0.6931472, abs=1e-6)
    assert all(torch.isfinite(torch.tensor(metrics[s]["train/loss"])) for s in (1, 2))
    assert summary["final"]["val/loss"] < summary["initial"]["val/loss"]


def test_stop_and_resume_is_bit_exact(tmp_path):
    straight = train(opts_for(tmp_path, "straight"))
    train(opts_for(tmp_path, "stopped", **{"rl.max_steps": 2}))
    resumed = train(opts_for(tmp_path, "stopped"))
    assert resumed["start_step"] == 2
    a, b = rows_in(Path(straight["run_dir"])), rows_in(Path(resumed["run_dir"]))
    for step in (3, 4):
        assert a[step]["train/loss"] == b[step]["train/loss"]
    weights = [
        load_file(str(Path(s["final_model"]) / "model.safetensors")) for s in (straight, resumed)
    ]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_sigterm_then_sigkill_then_resume_is_bit_exact(tmp_path):
    stops_then_resume(tmp_path, "lmdpo", RECIPE, opts_for)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["rollout.n=8"], "rollout.n=8 is never read by job.algorithm=lmdpo (LM DPO trains "
         "offline"),
        (["rl.kl_beta=0.1"], "rl.kl_beta=0.1 is never read by job.algorithm=lmdpo"),
        (["lmdpo.train_path=@default"], "lmdpo.train_path is not set"),
        (["rl.shared_prefix=off"], "rl.shared_prefix=off: the trainer would cut micro-batches "
         "through preference pairs"),
        (["rl.micro_batch_size=1"], "rl.micro_batch_size=1: a preference pair is two rows"),
        (["lmdpo.pairs_per_step=2", "placement.backend=ray", "placement.policy_ranks=3"],
         "lmdpo.pairs_per_step=2 gives some of placement.policy_ranks=3 no pair"),
        (["rl.micro_batch_tokens=10"], "rl.micro_batch_tokens=10: the pair at "),
        (["sft.max_tokens=9"], "sft.max_tokens=9 is read only by SFT, not by job.algorithm=lmdpo"),
        (["job.algorithm=grpo"], "job.algorithm=grpo is a GRPO-family algorithm (online RL), "
         "which `posttrain lmdpo` does not train"),
    ],
)  # fmt: skip
def test_config_errors_are_one_line(tmp_path, capsys, extra, fragment):
    code, err = _cli(capsys, "lmdpo", "--config", RECIPE, "--",
                     *opts_for(tmp_path, "x"), *extra)  # fmt: skip
    assert code == 2 and fragment in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ('{"prompt": "1+2=", "chosen": "3"}', ':6: a pair needs "chosen" and "rejected"'),
        ('{"prompt": "1+2=", "chosen": "3", "rejected": 4}',
         ':6: "rejected" must be a string or an assistant message'),
        ('{"messages": [{"role": "robot", "content": "x"}], "chosen": "3", "rejected": "4"}',
         ":6: message 0 has role 'robot'"),
        ('{"prompt": "1+2=", "chosen": "' + "9" * 80 + '", "rejected": "4"}',
         ':6: "chosen" renders to'),
        ("not json", ":6: not valid JSON"),
    ],
)  # fmt: skip
def test_a_bad_pair_stops_the_run_before_anything_is_written(tmp_path, capsys, row, fragment):
    bad = tmp_path / "bad.jsonl"
    good = (REPO / DATA / "train.jsonl").read_text().splitlines()
    bad.write_text("\n".join([*good[:5], row, *good[5:]]) + "\n")
    code, err = _cli(capsys, "lmdpo", "--config", RECIPE, "--",
                     *opts_for(tmp_path, "x", **{"lmdpo.train_path": bad}))  # fmt: skip
    assert code == 2 and f"{bad}{fragment}" in err and "\n" not in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "model").exists()
    code, err = _cli(capsys, "config", "show", "--config", RECIPE, "--",
                     *opts_for(tmp_path, "x", **{"lmdpo.train_path": bad}))  # fmt: skip
    assert code == 2 and f"{bad}{fragment}" in err


def test_fewer_held_out_pairs_than_ranks_is_one_line_before_ray_starts(tmp_path, capsys):
    val = tmp_path / "one.jsonl"
    val.write_text((REPO / DATA / "val.jsonl").read_text().splitlines(True)[0])
    extra = {"lmdpo.val_path": val, "placement.backend": "ray", "placement.policy_ranks": 2}
    code, err = _cli(capsys, "lmdpo", "--config", RECIPE, "--",
                     *opts_for(tmp_path, "x", **extra))  # fmt: skip
    assert code == 2 and "\n" not in err, err
    assert f"{val} has 1 held-out pair, fewer than placement.policy_ranks=2" in err
    assert not (tmp_path / "out").exists()


def test_the_other_entries_refuse_the_recipe(capsys):
    code, err = _cli(capsys, "grpo", "--config", RECIPE)
    assert code == 2 and "job.algorithm=lmdpo is DPO for language models" in err
    assert "run `posttrain lmdpo --config ...`" in err
    code, err = _cli(capsys, "dpo", "--config", RECIPE)
    assert code == 2 and "job.algorithm=lmdpo is DPO for language models" in err
