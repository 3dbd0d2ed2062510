"""``rl.reference_reset_every`` / ``rl.reset_optimizer`` in process: the refusals (one line each),
the resets and their metrics, and exact resume across a reset (full fine-tuning and LoRA)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain.config import load_config
from posttrain.config.build import build_objective, reference_on_data
from posttrain.control import PreflightError, run_preflight
from posttrain.entrypoints import grpo
from posttrain.model.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def opts_for(root: Path, model: Path, steps: int, **extra) -> list[str]:
    opts = {
        "job.output_root": str(root), "model.name_or_path": str(model),
        "data.train_size": 60, "data.val_size": 4, "data.prompts_per_step": 4, "rollout.n": 4,
        "rollout.max_tokens": 4, "reward.functions": "[role_fixtures:digit_reward]",
        "rl.grpo_surrogate": "clipped", "rl.kl_beta": 0.1, "rl.lr": 0.01, "rl.max_steps": steps,
        "rl.save_every": 1, "rl.eval_every": 0, "rl.micro_batch_size": 4,
        "logging.progress": False, "checkpoint.keep_last": 9, "rl.reference_reset_every": 2,
        **extra,
    }  # fmt: skip
    return [f"{k}={v}" for k, v in opts.items()]


def train(opts: list[str]) -> Path:
    config = load_config("arithmetic", ["--", *opts])
    summary = grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config), build_objective)
    return Path(summary["run_dir"])


def rows(run: Path) -> list[dict]:
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}
        for line in (run / "metrics.jsonl").read_text().splitlines()
    ]


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    model = run / "checkpoints" / f"step_{step:08d}" / "model"
    name = "adapter_model.safetensors" if (model / "adapter_model.safetensors").exists() else ""
    return load_file(str(model / (name or "model.safetensors")))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- the refusals ---------------------------------------------------------------------------------


def violations(*opts: str) -> list[str]:
    with pytest.raises(PreflightError) as e:
        run_preflight(load_config("arithmetic", ["--", "rl.grpo_surrogate=clipped", *opts]))
    assert all("\n" not in v for v in e.value.violations)
    return e.value.violations


def test_a_reset_without_a_kl_reference_is_refused_by_the_objectives_reads():
    assert violations("rl.reference_reset_every=5") == [
        "rl.reference_reset_every=5 is never read by rl.grpo_surrogate=clipped (no KL reference "
        "to reset with rl.kl_beta=0); reset with rl.reference_reset_every=@default (-> 0)"
    ]


def test_reset_optimizer_without_resets_is_refused():
    (line,) = violations("rl.kl_beta=0.1", "rl.reset_optimizer=true")
    assert line.startswith("rl.reset_optimizer=True is never read by rl.grpo_surrogate=clipped")
    assert "rl.reference_reset_every > 0" in line


def test_opd_refuses_a_reset_in_one_line_its_anchor_is_the_teacher():
    with pytest.raises(PreflightError) as e:
        run_preflight(load_config("opd_arithmetic", ["--", "rl.reference_reset_every=5"]))
    (line,) = e.value.violations
    assert "rl.reference_reset_every=5 is never read by OPD" in line
    assert "OPD has no KL reference to reset, its anchor is the teacher" in line


def test_a_reset_of_a_data_side_reference_is_refused_in_one_line():
    found = violations(
        "rl.kl_beta=0.1", "rl.reference_reset_every=5", "placement.reference_on=data"
    )
    start = "rl.reference_reset_every=5 needs the reference on the policy side"
    assert [v for v in found if v.startswith(start)], found


@pytest.mark.parametrize("lora", ["model.lora_rank=0", "model.lora_rank=4"])
def test_a_reset_under_fsdp_passes_preflight(lora):
    """Full fine-tuning's reference is sharded like the policy, LoRA's frozen adapters are
    swapped into the sharded layers (tests/test_fsdp_exact.py and tests/test_fsdp_ray.py)."""
    opts = [
        "rl.grpo_surrogate=clipped",
        "rl.kl_beta=0.1",
        "rl.reference_reset_every=5",
        "placement.policy_sharding=fsdp",
        "placement.backend=ray",
        "placement.policy_ranks=2",
        lora,
    ]
    assert run_preflight(load_config("arithmetic", ["--", *opts])) is not None


def test_auto_keeps_a_reset_reference_on_the_policy_side_under_a_lag():
    base = ["--", "rl.grpo_surrogate=clipped", "rl.kl_beta=0.1", "placement.backend=ray"]
    lagged = load_config("arithmetic", [*base, "rl.off_policy_lag=1"])
    reset = load_config("arithmetic", [*base, "rl.off_policy_lag=1", "rl.reference_reset_every=4"])
    assert reference_on_data(lagged) and not reference_on_data(reset)
    assert run_preflight(reset) is not None


# -- the runs ---------------------------------------------------------------------------------


def test_resets_every_n_steps_with_metrics_and_change_the_run(tiny_dir, tmp_path):
    run = train(opts_for(tmp_path / "reset", tiny_dir, 4))
    got = rows(run)
    assert [r["train/reference/resets"] for r in got] == [0, 1, 1, 2]
    assert (
        "train/reference/kl_before_reset" in got[1] and "train/reference/kl_after_reset" in got[2]
    )
    assert got[1]["train/reference/kl_before_reset"] == got[1]["train/pg/kl_ref"] > 0
    plain = train(opts_for(tmp_path / "plain", tiny_dir, 4, **{"rl.reference_reset_every": 0}))
    assert rows(plain)[1]["train/pg/kl_ref"] == got[1]["train/pg/kl_ref"]  # same until a reset
    assert not same(weights(plain, 4), weights(run, 4))  # the anchor moved from step 3 on
    clear = train(opts_for(tmp_path / "clear", tiny_dir, 4, **{"rl.reset_optimizer": True}))
    assert same(weights(clear, 2), weights(run, 2)) and not same(weights(clear, 4), weights(run, 4))


@pytest.mark.parametrize(
    "extra",
    [{"rl.reset_optimizer": True},
     {"model.lora_rank": 4, "model.lora_alpha": 8, "rl.lr": 1e-3}],
    ids=["full-reset-optimizer", "lora"],
)  # fmt: skip
def test_a_run_stopped_after_a_reset_resumes_bit_identically(tiny_dir, tmp_path, extra):
    straight = train(opts_for(tmp_path / "straight", tiny_dir, 5, **extra))
    train(opts_for(tmp_path / "resumed", tiny_dir, 3, **extra))  # stopped after the reset at 2
    resumed = train(opts_for(tmp_path / "resumed", tiny_dir, 5, **extra))
    assert same(weights(straight, 5), weights(resumed, 5))
    assert rows(resumed)[-2:] == rows(straight)[-2:]


def test_the_one_run_tools_demo_resets_every_600_steps_with_a_fresh_optimizer():
    cfg = load_config("tools_addition_reset")
    rl = cfg.rl
    assert (rl.max_steps, rl.reference_reset_every, rl.reset_optimizer) == (2000, 600, True)
    assert rl.kl_beta > 0 and run_preflight(cfg) == []
