"""Preflight rules of control/dpo.py: DPO reads no online knob, the online entries no dpo knob."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import DPO, Case, check_case, covered  # noqa: E402

from posttrain.control import dpo  # noqa: E402

SCHEDULE = f"model.name_or_path={Path(__file__).parent / 'fixtures' / 'dpo_schedule'}"

CASES: list[Case] = [
    ("dpo_reads_no_online_knobs", [*DPO, "rl.rollout_is_cap=2", "teacher.top_k=8"],
     "rl.rollout_is_cap=2.0, teacher.top_k=8 are never read by job.algorithm=dpo", DPO),
    ("dpo_reads_no_online_knobs", [*DPO, "rl.kl_beta=0.1", "rollout.n=4"],
     "rollout.n=4, rl.kl_beta=0.1 are never read by job.algorithm=dpo", DPO),
    ("dpo_knobs_without_dpo", ["dpo.beta=2"], "dpo.beta=2.0 is read only by Diffusion DPO",
     [*DPO, "dpo.beta=2"]),
    ("dpo_needs_pairs", ["job.algorithm=dpo"], "dpo.pairs_path is not set", DPO),
    ("beta_without_dpo_loss", [*DPO, "dpo.loss=sft_chosen", "dpo.beta=2"],
     "dpo.beta=2.0 is never read by dpo.loss=sft_chosen", [*DPO, "dpo.loss=sft_chosen"]),
    ("beta_without_dpo_loss", [*DPO, "dpo.loss=sft_chosen", "dpo.min_timestep=100"],
     "dpo.min_timestep=100 is never read", [*DPO, "dpo.min_timestep=100"]),
    ("dpo_single_policy_rank", [*DPO, "placement.backend=ray", "placement.policy_ranks=2"],
     "the DPO entry trains one policy rank", [*DPO, "placement.backend=ray"]),
    ("dpo_timesteps_within_schedule", [*DPO, SCHEDULE, "dpo.min_timestep=5000"],
     "dpo.min_timestep=5000 exceeds the model's schedule of 1000", [*DPO, SCHEDULE]),
]  # fmt: skip


def test_every_rule_of_the_module_has_a_case():
    assert covered(CASES, dpo)


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(name, bad, fragment, good):
    check_case(name, bad, fragment, good)
