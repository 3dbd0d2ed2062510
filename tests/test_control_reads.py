"""Rejections derived from the objectives' declared reads (control/reads.py), for the built-in
objectives and for custom builders, declared or not."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import (  # noqa: E402
    DIRECT,
    GSPO,
    LEGACY,
    OPD,
    SEQ,
    Case,
    cfg,
    check_case,
    covered,
)

from posttrain.config.build import OBJECTIVE_KNOBS, needs_reference, objective_reads  # noqa: E402
from posttrain.control import PreflightError, reads, run_preflight  # noqa: E402

CASES: list[Case] = [
    ("objective_builder_loads", ["rl.objective_builder=no_such_module_xyz:build"],
     "rl.objective_builder 'no_such_module_xyz:build': cannot import module",
     ["rl.objective_builder=posttrain.config.build:build_objective"]),
    ("objective_builder_loads", ["rl.objective_builder=posttrain.config.build:nothing_here"],
     "has no attribute 'nothing_here'", []),
    # legacy_pg: no ratio, no clip, no KL, no entropy term, token mean, temperature 1
    ("objective_reads_its_knobs", [*LEGACY, "rl.epsilon_low=0.1"],
     "rl.epsilon_low=0.1 is never read by rl.grpo_surrogate=legacy_pg (no ratio clip); reset "
     "with rl.epsilon_low=@default (-> 0.2)", LEGACY),
    ("objective_reads_its_knobs", [*LEGACY, "rl.epsilon_high=0.28", "rl.lower_bound_ratio=3"],
     "rl.epsilon_high=0.28, rl.lower_bound_ratio=3.0 are never read", ["rl.lower_bound_ratio=3"]),
    ("objective_reads_its_knobs", [*LEGACY, "rl.loss_type=seq-mean-token-sum"],
     "rl.loss_type=seq-mean-token-sum is never read by rl.grpo_surrogate=legacy_pg (always the "
     "token mean)", ["rl.loss_type=seq-mean-token-sum"]),
    ("objective_reads_its_knobs", [*LEGACY, "rl.kl_beta=0.1"],
     "rl.kl_beta=0.1 is never read by rl.grpo_surrogate=legacy_pg (no KL term)", ["rl.kl_beta=0.1"]),
    ("objective_reads_its_knobs", [*LEGACY, "rl.temperature=0.7"],
     "rl.temperature=0.7 is never read by rl.grpo_surrogate=legacy_pg (it scores at temperature 1)",
     LEGACY),
    ("objective_reads_its_knobs", [*LEGACY, *SEQ],
     "rl.importance_sampling_level=sequence is never read by rl.grpo_surrogate=legacy_pg", SEQ),
    ("objective_reads_its_knobs", [*LEGACY, "rl.entropy_coef=0.01"],
     "rl.entropy_coef=0.01 is never read by rl.grpo_surrogate=legacy_pg (no entropy term)",
     ["rl.entropy_coef=0.01"]),
    ("objective_reads_its_knobs", [*LEGACY, "rl.rollout_is_cap=2"],
     "rl.rollout_is_cap=2.0 is never read by rl.grpo_surrogate=legacy_pg",
     ["rl.rollout_is_cap=2"]),
    # clipped: the sub-knobs read only in some settings
    ("objective_reads_its_knobs", ["rl.kl_estimator=k1"],
     "rl.kl_estimator=k1 is never read by rl.grpo_surrogate=clipped (no KL anchor with "
     "rl.kl_beta=0)", ["rl.kl_estimator=k1", "rl.kl_beta=0.1"]),
    ("objective_reads_its_knobs", [*GSPO, "rl.lower_bound_ratio=3"],
     "rl.lower_bound_ratio=3.0 is never read by rl.grpo_surrogate=clipped, "
     "rl.importance_sampling_level=sequence (the dual clip", ["rl.lower_bound_ratio=3"]),
    # the advantage's own declaration, part of every objective that trains on advantages
    ("objective_reads_its_knobs", ["rl.advantage_estimator=dr_grpo", "rl.advantage_eps=1e-4"],
     "rl.advantage_eps=0.0001 is never read by rl.grpo_surrogate=clipped (no std division with "
     "rl.advantage_estimator=dr_grpo)", ["rl.advantage_eps=1e-4"]),
    ("objective_reads_its_knobs",
     ["rl.advantage_estimator=rloo", "rl.reward_scaling=none", "rl.advantage_eps=1e-4"],
     "no std division with rl.advantage_estimator=rloo",
     ["rl.advantage_estimator=rloo", "rl.reward_scaling=batch", "rl.advantage_eps=1e-4"]),
    ("objective_reads_its_knobs", ["rl.advantage_estimator=reinforce_pp", "rl.reward_scaling=batch"],
     "rl.reward_scaling=batch is never read by rl.grpo_surrogate=clipped "
     "(rl.advantage_estimator=reinforce_pp fixes its own scaling)",
     ["rl.advantage_estimator=grpo", "rl.reward_scaling=batch"]),
    ("objective_reads_its_knobs", ["rl.advantage_estimator=dr_grpo", "rl.reward_scaling=none"],
     "fixes its own scaling", ["rl.advantage_estimator=rloo", "rl.reward_scaling=none"]),
    ("objective_reads_its_knobs", ["reward.overlong_penalty=0.5"],
     "reward.overlong_penalty=0.5 is never read by rl.grpo_surrogate=clipped (the overlong "
     "punishment is off at overlong_buffer=0)",
     ["reward.overlong_penalty=0.5", "reward.overlong_buffer=64"]),
    # GRPO reads no OPD knob
    ("objective_reads_its_knobs", ["rl.distillation_mode=direct"],
     "rl.distillation_mode=direct is never read by rl.grpo_surrogate=clipped",
     [*OPD, "rl.distillation_mode=direct"]),
    ("objective_reads_its_knobs", ["rl.divergence=jsd", "teacher.top_k=8"],
     "rl.divergence=jsd, teacher.top_k=8 are never read by rl.grpo_surrogate=clipped",
     [*DIRECT, "rl.divergence=jsd", "teacher.top_k=8"]),
    # OPD: the teacher is the signal
    ("objective_reads_its_knobs", [*OPD, *SEQ], "its signal is per token", OPD),
    ("objective_reads_its_knobs", [*OPD, "rl.kl_beta=0.1", "rl.advantage_estimator=rloo"],
     "rl.kl_beta=0.1 is never read by OPD, rl.distillation_mode=advantage (the teacher is the "
     "signal, on the clipped surrogate)", ["rl.kl_beta=0.1", "rl.advantage_estimator=rloo"]),
    ("objective_reads_its_knobs", [*OPD, "rl.advantage_estimator=rloo"],
     "rl.advantage_estimator=rloo is never read by OPD, rl.distillation_mode=advantage (the "
     "teacher is the signal, not the task reward)", OPD),
    ("objective_reads_its_knobs", [*OPD, "rl.entropy_coef=0.01"],
     "rl.entropy_coef=0.01 is never read by OPD", OPD),
    ("objective_reads_its_knobs", [*OPD, "rl.grpo_surrogate=legacy_pg"],
     "rl.grpo_surrogate=legacy_pg is never read by OPD", OPD),
    ("objective_reads_its_knobs", [*OPD, "reward.overlong_buffer=8"],
     "reward.overlong_buffer=8 is never read by OPD", ["reward.overlong_buffer=8"]),
    ("objective_reads_its_knobs", [*DIRECT, "rl.epsilon_high=0.28"],
     "rl.epsilon_high=0.28 is never read by OPD, rl.distillation_mode=direct (no ratio, no clip)",
     [*OPD, "rl.epsilon_high=0.28"]),
    ("objective_reads_its_knobs", [*OPD, "rl.divergence=forward_kl", "teacher.top_k=8"],
     "rl.divergence=forward_kl, teacher.top_k=8 are never read by OPD, "
     "rl.distillation_mode=advantage (read only with rl.distillation_mode=direct)",
     [*DIRECT, "rl.divergence=forward_kl", "teacher.top_k=8"]),
    ("objective_reads_its_knobs", [*DIRECT, "rl.jsd_beta=0.1"],
     "rl.jsd_beta=0.1 is never read by OPD, rl.distillation_mode=direct (read only by "
     "rl.divergence=jsd)", [*DIRECT, "rl.divergence=jsd", "rl.jsd_beta=0.1"]),
]  # fmt: skip


def test_every_rule_of_the_module_has_a_case():
    assert covered(CASES, reads)


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(name, bad, fragment, good):
    check_case(name, bad, fragment, good)


def test_knobs_of_different_reasons_are_one_line_with_each_reason():
    message = reads.objective_reads_its_knobs.check(
        cfg([*LEGACY, "rl.epsilon_low=0.1", "rl.kl_beta=0.1"])
    )
    assert message == (
        "rl.epsilon_low=0.1 is never read by rl.grpo_surrogate=legacy_pg (no ratio clip); reset "
        "with rl.epsilon_low=@default (-> 0.2); rl.kl_beta=0.1 is never read by "
        "rl.grpo_surrogate=legacy_pg (no KL term); reset with rl.kl_beta=@default (-> 0.0)"
    )


def test_dpo_has_no_online_objective_declaration():
    assert objective_reads(cfg(["job.algorithm=dpo"])) is None


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A working directory with a declared and an undeclared custom builder (a fresh module
    name per test: a module imported once stays imported)."""
    name = f"knob_objectives_{os.getpid()}_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from posttrain.algorithm.annotators.advantage import advantage_reads
            from posttrain.algorithm.primitives.reads import declare_reads
            from posttrain.config.build import build_objective


            @declare_reads(advantage_reads, "rl.temperature", "rl.loss_type")
            def declared(rl, context):
                return build_objective(rl, context)


            def undeclared(rl, context):
                return build_objective(rl, context)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)


def test_custom_builder_that_does_not_read_kl_beta_refuses_it_and_builds_no_reference(user_dir):
    opts = [f"rl.objective_builder={user_dir}:declared", "rl.kl_beta=0.05"]
    with pytest.raises(PreflightError) as info:
        run_preflight(cfg(opts))
    assert str(info.value) == (
        f"preflight: rl.kl_beta=0.05 is never read by the objective builder {user_dir}:declared; "
        "reset with rl.kl_beta=@default (-> 0.0)"
    )
    assert not needs_reference(cfg(opts))
    # what it declares it reads is accepted
    assert run_preflight(cfg([f"rl.objective_builder={user_dir}:declared", "rl.loss_type=seq-mean-token-sum"])) == []  # fmt: skip


def test_undeclared_custom_builder_reads_what_the_builtin_reads(user_dir):
    opts = [f"rl.objective_builder={user_dir}:undeclared", "rl.kl_beta=0.05"]
    assert run_preflight(cfg(opts)) == []
    assert needs_reference(cfg(opts))
    assert objective_reads(cfg(opts)) == objective_reads(cfg(["rl.kl_beta=0.05"]))
    with pytest.raises(
        PreflightError, match="rl.epsilon_low=0.1 is never read by rl.grpo_surrogate=legacy_pg"
    ):
        run_preflight(cfg([f"rl.objective_builder={user_dir}:undeclared", *LEGACY, "rl.epsilon_low=0.1"]))  # fmt: skip


@pytest.mark.parametrize(
    ("opts", "reference"),
    [([], False), (["rl.kl_beta=0.1"], True), ([*OPD], False),
     (["job.algorithm=dpo"], False)],
)  # fmt: skip
def test_a_reference_is_needed_exactly_when_the_declaration_reads_a_positive_kl_beta(
    opts, reference
):
    assert needs_reference(cfg(opts)) is reference


def test_the_universe_holds_only_real_keys():
    from posttrain.config import all_keys

    assert set(all_keys()) >= OBJECTIVE_KNOBS
