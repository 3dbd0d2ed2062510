"""Preflight warnings of control/inert.py: honoured settings without effect."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import GSPO, Case, cfg, check_case, covered  # noqa: E402

from posttrain.control import inert  # noqa: E402
from posttrain.control.inert import TOKEN_SCALE_EPSILON  # noqa: E402

CASES: list[Case] = [
    ("sequence_level_on_policy_ratio", [*GSPO, "rl.mini_batch_per_replica=1"],
     "rl.mini_batch_per_replica=1: every update is on-policy", GSPO),
    ("sequence_level_token_scale_epsilons", [*GSPO, "rl.epsilon_high=0.28"],
     "rl.epsilon_low=0.0003, rl.epsilon_high=0.28 are token-scale", GSPO),
    ("sequence_level_token_scale_epsilons", [*GSPO, f"rl.epsilon_low={TOKEN_SCALE_EPSILON}"],
     "token-scale", [*GSPO, f"rl.epsilon_low={TOKEN_SCALE_EPSILON / 2}"]),
    ("sequence_level_bf16_logprobs", [*GSPO, "model.dtype=bfloat16"], "model.dtype=bfloat16 at",
     ["model.dtype=bfloat16"]),
    ("sequence_level_length_weighting", [*GSPO, "rl.loss_type=seq-mean-token-sum-fixed"],
     "rl.loss_type=seq-mean-token-sum-fixed at rl.importance_sampling_level=sequence",
     ["rl.loss_type=seq-mean-token-sum-fixed"]),
    ("sequence_level_length_weighting", [*GSPO, "rl.loss_type=seq-mean-token-sum"],
     "weights responses by length", [*GSPO, "rl.loss_type=token-mean"]),
    ("dynamic_sampling_batch_baseline",
     ["rl.dynamic_sampling=true", "rl.advantage_estimator=reinforce_pp"],
     "groups of equal rewards are dropped", ["rl.dynamic_sampling=true"]),
    ("token_budget_below_one_row", ["rl.micro_batch_tokens=16", "rollout.max_tokens=16"],
     "rl.micro_batch_tokens=16 is below one row", ["rl.micro_batch_tokens=17",
                                                   "rollout.max_tokens=16"]),
]  # fmt: skip


def test_every_rule_of_the_module_has_a_case():
    assert covered(CASES, inert)


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(name, bad, fragment, good):
    check_case(name, bad, fragment, good)


def test_sequence_warnings_follow_the_declaration_not_the_surrogate_name():
    # legacy_pg never reads the ratio level, so no sequence-level warning can fire for it (the
    # derived rejection reports the unread knob instead).
    assert inert.sequence_level_bf16_logprobs.check(
        cfg(["rl.grpo_surrogate=legacy_pg", "rl.importance_sampling_level=sequence",
             "model.dtype=bfloat16"])
    ) is None  # fmt: skip
