"""run_preflight (control/preflight.py): every rule once, aggregated into one line; warnings
once, in rule order. Each module's rules are tested in test_control_<module>.py."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import GSPO, JSONL, LEGACY, OPD, SEQ, cfg  # noqa: E402

from posttrain.config import ConfigError, PosttrainConfig, all_keys  # noqa: E402
from posttrain.control import (  # noqa: E402
    RULES,
    PreflightError,
    consistency,
    dpo,
    entries,
    external,
    inactive,
    inert,
    lag,
    lmdpo,
    opd,
    reads,
    reset,
    run_preflight,
    sft,
    temperature,
    vllm,
)

MODULES = (
    reads, temperature, inactive, inert, consistency, lag, reset, external, vllm, entries, opd,
    dpo, sft, lmdpo,
)  # fmt: skip


def test_preflight_runs_every_module_rule_once_and_each_reads_real_keys():
    assert [r.name for r in RULES] == [r.name for m in MODULES for r in m.RULES]
    assert len({r.name for r in RULES}) == len(RULES)
    keys = set(all_keys())
    for rule in RULES:
        assert rule.reads and set(rule.reads) <= keys, rule.name
        assert rule.doc and rule.severity in ("error", "warning")


@pytest.mark.parametrize(
    "opts", [[], OPD, GSPO, JSONL, LEGACY, ["job.algorithm=dpo", "dpo.pairs_path=p"]]
)
def test_defaults_and_clean_recipes_pass_without_warnings(opts):
    assert run_preflight(cfg(opts)) == []


def test_all_violations_are_reported_in_one_line():
    config = cfg([*LEGACY, "rl.epsilon_low=0.1", "rl.kl_beta=0.5", "rollout.temperature=0.5"])
    with pytest.raises(PreflightError) as info:
        run_preflight(config)
    assert len(info.value.violations) == 2  # the unread knobs (one rule), the temperature
    assert isinstance(info.value, ConfigError)
    text = str(info.value)
    assert text.startswith("preflight: ") and "\n" not in text
    assert all(v in text for v in info.value.violations)
    assert "rl.epsilon_low=0.1" in text and "rl.kl_beta=0.5" in text


def test_preflight_error_pickles_with_its_violations():
    error = PreflightError(["a=1 is never read", "b=2 is never read"])
    copy = pickle.loads(pickle.dumps(error))
    assert copy.violations == error.violations and str(copy) == str(error)


def test_warnings_are_returned_once_in_rule_order():
    config = cfg([*SEQ, "model.dtype=bfloat16"])
    warnings = run_preflight(config)
    assert len(warnings) == len(set(warnings)) == 3
    assert warnings[0].startswith("rl.importance_sampling_level=sequence with")
    assert run_preflight(config) == warnings


def test_default_config_is_clean():
    assert run_preflight(PosttrainConfig()) == []
