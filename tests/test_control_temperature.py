"""The sampling contract (control/temperature.py): the loss scores at the temperature its
objective declares, and the responses must come from that temperature."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import LEGACY, OPD, Case, check_case, covered  # noqa: E402

from posttrain.control import temperature  # noqa: E402

CASES: list[Case] = [
    ("loss_temperature_matches_rollout", ["rollout.temperature=0.7"],
     "rl.grpo_surrogate=clipped scores at rl.temperature, so it needs rl.temperature == "
     "rollout.temperature, got 1.0 and 0.7", ["rollout.temperature=0.7", "rl.temperature=0.7"]),
    ("loss_temperature_matches_rollout", ["rl.temperature=2"], "got 2.0 and 1.0", []),
    ("loss_temperature_matches_rollout", [*OPD, "rollout.temperature=0.5"],
     "OPD, rl.distillation_mode=advantage scores at rl.temperature", OPD),
    ("loss_temperature_matches_rollout", [*LEGACY, "rollout.temperature=0.7"],
     "rl.grpo_surrogate=legacy_pg scores at temperature 1, so rollout.temperature must be 1.0 "
     "(got 0.7)", LEGACY),
    ("top_p_truncates_sampling", ["rollout.top_p=0.9"], "rollout.top_p=0.9: responses come from",
     ["rollout.top_p=1"]),
]  # fmt: skip


def test_every_rule_of_the_module_has_a_case():
    assert covered(CASES, temperature)


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(name, bad, fragment, good):
    check_case(name, bad, fragment, good)
