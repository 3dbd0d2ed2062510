"""The examples users copy from must keep running."""

from __future__ import annotations

import copy
import dataclasses
import math
import runpy
from pathlib import Path

import pytest
import torch

from posttrain.rollout.torch_engine import TorchRolloutEngine

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_custom_objective_example_runs(capsys):
    ns = runpy.run_path(str(EXAMPLES / "custom_objective.py"))
    loss = ns["main"]()
    assert "bonus=" in capsys.readouterr().out
    assert loss == loss  # finite, not NaN


def test_loss_table_covers_every_variant_and_loss_type():
    ns = runpy.run_path(str(EXAMPLES / "loss_table.py"))
    rows = ns["rows"]()
    assert len(rows) == 4 * 4 + 1
    assert {r[0] for r in rows} >= {"GSPO sequence", "clipped dual (c=3)", "legacy_pg"}


def _one_file():
    path = EXAMPLES / "grpo_one_file.py"
    assert len(path.read_text().splitlines()) <= 300
    return runpy.run_path(str(path))


def test_grpo_one_file_trains_a_few_steps(capsys):
    argv = ["--steps", "3", "--prompts-per-step", "4", "--n", "4", "--eval-every", "2"]
    record = _one_file()["main"]([*argv, "--updates-per-batch", "2", "--micro-batch-size", "3"])
    out = capsys.readouterr().out
    assert out.startswith("step 0: held-out accuracy") and "step 2:" in out and "step 3:" in out
    assert 0.0 <= record["val_accuracy"] <= 1.0
    assert all(math.isfinite(v) for v in record.values())
    assert record["ratio_mean"] != 1.0  # the second update of a batch is off-policy


def test_grpo_one_file_update_is_exact_for_any_micro_batch_size():
    ns = _one_file()
    args = ns["Args"](prompts_per_step=4, n=4, grad_clip=1e9)
    model, tokenizer, reference, tasks = ns["build"](args)
    items, _ = tasks.take(0, 0, 4)
    rollout = ns["sample"](TorchRolloutEngine(model, tokenizer), tokenizer, items, 4, 1.0, 3, 1)
    batch = rollout.batch
    generator = torch.Generator().manual_seed(0)
    adv = torch.randn(len(batch), generator=generator)  # a signal even if every reward is 0
    old = ns["frozen_logprobs"](model, batch, 64, 1.0)
    old = old + 0.3 * torch.randn(old.shape, generator=generator)  # ratios away from 1: clipping
    ref = ns["frozen_logprobs"](reference, batch, 64, 1.0)

    def step(micro: int):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        run = dataclasses.replace(args, micro_batch_size=micro)
        metrics = ns["update"](m, opt, batch, adv, old, ref, run)
        return torch.cat([p.detach().flatten() for p in m.parameters()]), metrics

    whole, whole_metrics = step(len(batch))
    assert whole_metrics["clip_frac_low"] + whole_metrics["clip_frac_high"] > 0
    for micro in (5, 1):
        params, metrics = step(micro)
        torch.testing.assert_close(params, whole, rtol=0, atol=1e-6)
        assert metrics["loss"] == pytest.approx(whole_metrics["loss"], abs=1e-6)
    # the naive alternative -- a mean of per-chunk token means -- gives a different loss
    chunk_means = []
    for i in range(0, len(batch), 5):
        rows = slice(i, i + 5)
        with torch.no_grad():
            num, weight, _ = ns["chunk_loss"](
                model, batch[rows], adv[rows], old[rows], ref[rows], args
            )
        chunk_means.append(float(num / weight))
    assert abs(sum(chunk_means) / len(chunk_means) - whole_metrics["loss"]) > 1e-4


def test_the_jsonl_user_recipe_checks_and_trains(tmp_path, monkeypatch, capsys):
    from posttrain.data.tasks import read_gsm8k_jsonl
    from posttrain.entrypoints.cli import main

    recipe = EXAMPLES / "jsonl_recipe" / "recipe.py"
    guide = (EXAMPLES.parent / "docs" / "guides" / "config.md").read_text()
    text = recipe.read_text()
    assert text[text.index("from pathlib import Path") :] in guide  # the guide shows this file
    assert len(read_gsm8k_jsonl(recipe.parent / "train.jsonl")) == 12
    monkeypatch.chdir(tmp_path)  # the recipe finds its data from any working directory
    assert main(["config", "show", "--config", str(recipe)]) == 0
    assert "task: jsonl" in capsys.readouterr().out
    opts = ["rl.max_steps=2", "rl.eval_every=2", "rl.save_every=0", "logging.progress=false"]
    assert main(["grpo", "--config", str(recipe), "--", *opts]) == 0
    out = capsys.readouterr().out
    assert "trained 2 steps" in out and "held-out accuracy" in out and "(4 problems" in out
    assert (tmp_path / "outputs/grpo/word_problems/metrics.jsonl").is_file()
