"""Preflight rules of control/inactive.py: one setting, one name; loop knobs read in one mode."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import Case, check_case, covered  # noqa: E402

from posttrain.control import inactive  # noqa: E402

CASES: list[Case] = [
    ("grpo_unscaled_is_dr_grpo", ["rl.reward_scaling=none"], "write rl.advantage_estimator=dr_grpo",
     ["rl.advantage_estimator=dr_grpo"]),
    ("sampling_rounds_need_dynamic_sampling", ["rl.max_sampling_rounds=5"],
     "rl.max_sampling_rounds=5 is never read with rl.dynamic_sampling=false",
     ["rl.max_sampling_rounds=5", "rl.dynamic_sampling=true"]),
]  # fmt: skip


def test_every_rule_of_the_module_has_a_case():
    assert covered(CASES, inactive)


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(name, bad, fragment, good):
    check_case(name, bad, fragment, good)
