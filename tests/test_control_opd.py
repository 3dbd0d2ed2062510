"""Preflight of control/opd.py: the teacher role and OPD's warnings."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import OPD, Case, check_case, covered  # noqa: E402

from posttrain.control import opd  # noqa: E402

CASES: list[Case] = [
    ("opd_needs_teacher", ["job.algorithm=opd"], "job.algorithm=opd needs teacher.name_or_path",
     OPD),
    ("opd_direct_ignores_reward", [*OPD, "rl.distillation_mode=direct"],
     "task reward and group advantage are not training signals", OPD),
    ("dynamic_sampling_drops_teacher_signal", [*OPD, "rl.dynamic_sampling=true"],
     "job.algorithm=opd: groups of equal task rewards are dropped", ["rl.dynamic_sampling=true"]),
    ("teacher_needs_opd", ["teacher.name_or_path=t"],
     "teacher.name_or_path=t is never read by job.algorithm=grpo (no teacher)", OPD),
]  # fmt: skip


def test_every_rule_of_the_module_has_a_case():
    assert covered(CASES, opd)


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(name, bad, fragment, good):
    check_case(name, bad, fragment, good)
