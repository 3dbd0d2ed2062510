"""The GRPO entry with the post-GRPO settings on: estimator, overlong shaping, masking."""

from __future__ import annotations

from test_entry_grpo import metrics_of, quick_opts, tiny_dir, train  # noqa: F401 (fixture)


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
