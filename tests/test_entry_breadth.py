"""The GRPO entry with the post-GRPO settings on: estimator, overlong shaping, masking, dynamic
sampling."""

from __future__ import annotations

from pathlib import Path

import torch
from test_entry_grpo import (  # noqa: F401 (tiny_dir is a fixture)
    _strip_timing,
    metrics_of,
    quick_opts,
    tiny_dir,
    train,
)


def test_estimator_and_overlong_shaping_reach_the_step(tmp_path, tiny_dir):  # noqa: F811
    opts = quick_opts(
        tmp_path, tiny_dir,
        **{"rl.max_steps": 2, "rl.eval_every": 0, "data.val_size": 0,
           "rl.grpo_surrogate": "clipped", "rl.advantage_estimator": "rloo",
           "rl.reward_scaling": "none", "rl.entropy_coef": 0.01,
           "reward.overlong_buffer": 2, "reward.overlong_penalty": 0.5,
           "reward.mask_truncated": True},
    )  # fmt: skip
    rows = metrics_of(train(opts))[1:]
    for row in rows:
        # max_tokens 3, buffer 2: a response of 2 or 3 tokens loses 0.25 or 0.5.
        assert 0 < row["train/reward_overlong_penalty_mean"] <= 0.5
        # The untrained tiny model never stops before the bound: every response is truncated,
        # so mask_truncated leaves no loss token and the trainer skips the update.
        assert row["train/reward_truncated_frac"] == 1.0
        assert row["train/skipped_empty"] == 1


PARITY = "def parity(prompt, completion, answer, meta):\n    return float(len(completion) % 2)\n"


def test_dynamic_sampling_counts_rounds_and_resumes_exactly(tmp_path, tiny_dir, monkeypatch):  # noqa: F811
    (tmp_path / "parity_reward.py").write_text(PARITY)
    monkeypatch.syspath_prepend(str(tmp_path))
    knobs = {"rl.dynamic_sampling": True, "rl.max_sampling_rounds": 3, "rl.eval_every": 0,
             "data.val_size": 0, "reward.functions": "[parity_reward:parity]"}  # fmt: skip
    straight = train(quick_opts(tmp_path / "a", tiny_dir, **knobs))
    rows = metrics_of(straight)  # no step-0 row: evaluation is off
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    rounds = [r["train/sampling/rounds"] for r in rows]
    for r in rows:
        assert 1 <= r["train/sampling/rounds"] <= 3
        assert r["train/sampling/kept_groups"] + r["train/sampling/shortfall_groups"] == 4
        if r["train/sampling/shortfall_groups"] == 0:  # the batch holds informative groups only
            assert r["train/reward_zero_variance_group_frac"] == 0
    # The data cursor advanced by data.prompts_per_step per round, and the checkpoint holds it.
    ckpt = Path(straight["run_dir"]) / "checkpoints" / "step_00000004" / "data_state.pt"
    assert torch.load(ckpt, weights_only=True)["cursor"] == 4 * sum(rounds)
    train(quick_opts(tmp_path / "b", tiny_dir, **{**knobs, "rl.max_steps": 2}))
    resumed = train(quick_opts(tmp_path / "b", tiny_dir, **knobs))
    assert resumed["start_step"] == 2
    assert _strip_timing(metrics_of(resumed)) == _strip_timing(metrics_of(straight))
