"""Shared by the tests of each preflight module: config shorthands and the case check.

A case is (rule name, overrides that trip it, a fragment of its message, overrides one step away
that satisfy it); every rule of a module has at least one.
"""

from __future__ import annotations

import pytest

from posttrain.config import PosttrainConfig, apply_overrides
from posttrain.control import RULES, PreflightError, run_preflight

LEGACY = ["rl.grpo_surrogate=legacy_pg"]
SEQ = ["rl.importance_sampling_level=sequence"]
GSPO = [
    *SEQ,
    "rl.epsilon_low=3e-4",
    "rl.epsilon_high=4e-4",
    "rl.loss_type=seq-mean-token-mean",
    "rl.mini_batch_per_replica=2",
]
OPD = ["job.algorithm=opd", "teacher.name_or_path=teacher"]
DIRECT = [*OPD, "rl.distillation_mode=direct"]
DPO = ["job.algorithm=dpo", "dpo.pairs_path=pairs.jsonl"]
CERTIFIED = ["model.certified_deterministic_forward=true"]
JSONL = ["data.task=jsonl", "data.train_path=train.jsonl", "data.val_path=val.jsonl"]

Case = tuple[str, list[str], str, list[str]]
BY_NAME = {r.name: r for r in RULES}


def cfg(opts: list[str]) -> PosttrainConfig:
    return apply_overrides(PosttrainConfig(), opts)


def check_case(name: str, bad: list[str], fragment: str, good: list[str]) -> None:
    """The rule trips on ``bad`` with ``fragment`` in its one-line message (and run_preflight
    reports it), and passes on ``good``."""
    rule = BY_NAME[name]
    message = rule.check(cfg(bad))
    assert message is not None and fragment in message, message
    assert rule.check(cfg(good)) is None, rule.check(cfg(good))
    if rule.severity == "error":
        with pytest.raises(PreflightError) as info:
            run_preflight(cfg(bad))
        assert message in info.value.violations and "\n" not in str(info.value)
    else:
        assert message in run_preflight(cfg(bad))


def covered(cases: list[Case], module) -> bool:
    """Every rule of ``module`` has a case, and every case names one of its rules."""
    return {c[0] for c in cases} == {r.name for r in module.RULES}
