"""Preflight rules of control/lmdpo.py: its pairs file, micro-batches that keep pairs whole, a
reference that computes as a sharded policy does (what it refuses as a policy-only entry, and
the pairs a step needs per rank, are tested in test_control_entries.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import Case, check_case, covered  # noqa: E402

from posttrain.control import lmdpo  # noqa: E402

LMDPO = ["job.algorithm=lmdpo", "lmdpo.train_path=pairs.jsonl"]
FSDP_BF16 = [
    *LMDPO,
    "placement.backend=ray",
    "placement.policy_sharding=fsdp",
    "model.dtype=bfloat16",
]

CASES: list[Case] = [
    ("lmdpo_needs_train_path", ["job.algorithm=lmdpo"], "lmdpo.train_path is not set", LMDPO),
    ("pairs_stay_whole", [*LMDPO, "rl.shared_prefix=off"],
     "rl.shared_prefix=off: the trainer would cut micro-batches through preference pairs", LMDPO),
    ("pairs_stay_whole", [*LMDPO, "rl.micro_batch_size=1"],
     "rl.micro_batch_size=1: a preference pair is two rows", [*LMDPO, "rl.micro_batch_size=2"]),
    ("sharded_bf16_reference_needs_lora", FSDP_BF16,
     "placement.policy_sharding=fsdp with model.dtype=bfloat16 and no LoRA",
     [*FSDP_BF16, "model.lora_rank=8"]),
    ("sharded_bf16_reference_needs_lora", FSDP_BF16,
     "set model.lora_rank", [*LMDPO, "placement.backend=ray", "placement.policy_sharding=fsdp"]),
]  # fmt: skip


def test_every_rule_of_the_module_has_a_case():
    assert covered(CASES, lmdpo)


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(name, bad, fragment, good):
    check_case(name, bad, fragment, good)
