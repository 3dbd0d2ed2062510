"""Preflight rules of control/sft.py: SFT's data file, packing's loss unit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import Case, check_case, covered  # noqa: E402

from posttrain.control import sft  # noqa: E402

SFT = ["job.algorithm=sft", "sft.train_path=rows.jsonl"]

CASES: list[Case] = [
    ("sft_needs_train_path", ["job.algorithm=sft"], "sft.train_path is not set", SFT),
    ("packing_needs_token_sum", [*SFT, "sft.packing=true", "sft.loss_reduction=sequence_mean"],
     "sft.packing=true with sft.loss_reduction=sequence_mean", [*SFT, "sft.packing=true"]),
]  # fmt: skip


def test_every_rule_of_the_module_has_a_case():
    assert covered(CASES, sft)


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(name, bad, fragment, good):
    check_case(name, bad, fragment, good)
