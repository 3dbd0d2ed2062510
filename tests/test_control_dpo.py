"""Preflight rules of control/dpo.py: its pairs, its loss's knobs, its schedule (what DPO refuses
as a policy-only entry is tested in test_control_entries.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import DPO, Case, check_case, covered  # noqa: E402

from posttrain.control import dpo  # noqa: E402

SCHEDULE = f"model.name_or_path={Path(__file__).parent / 'fixtures' / 'dpo_schedule'}"

CASES: list[Case] = [
    ("dpo_needs_pairs", ["job.algorithm=dpo"], "dpo.pairs_path is not set", DPO),
    ("beta_without_dpo_loss", [*DPO, "dpo.loss=sft_chosen", "dpo.beta=2"],
     "dpo.beta=2.0 is never read by dpo.loss=sft_chosen", [*DPO, "dpo.loss=sft_chosen"]),
    ("beta_without_dpo_loss", [*DPO, "dpo.loss=sft_chosen", "dpo.min_timestep=100"],
     "dpo.min_timestep=100 is never read", [*DPO, "dpo.min_timestep=100"]),
    ("dpo_timesteps_within_schedule", [*DPO, SCHEDULE, "dpo.min_timestep=5000"],
     "dpo.min_timestep=5000 exceeds the model's schedule of 1000", [*DPO, SCHEDULE]),
]  # fmt: skip


def test_every_rule_of_the_module_has_a_case():
    assert covered(CASES, dpo)


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(name, bad, fragment, good):
    check_case(name, bad, fragment, good)
