"""The entry registry and the preflight derived from it (control/entries.py): which entry trains
which algorithm, what a policy-only entry refuses, which sections only one entry reads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import DPO, Case, cfg, check_case, covered  # noqa: E402

from posttrain.control import PreflightError, entries, objective_family  # noqa: E402
from posttrain.control.entries import check_entry, refuse_unread_overrides  # noqa: E402
from posttrain.entrypoints import registry  # noqa: E402

SFT = ["job.algorithm=sft", "sft.train_path=rows.jsonl"]
LMDPO = ["job.algorithm=lmdpo", "lmdpo.train_path=pairs.jsonl"]

CASES: list[Case] = [
    ("entry_reads_no_online_knobs", [*DPO, "rl.rollout_is_cap=2", "teacher.top_k=8"],
     "rl.rollout_is_cap=2.0, teacher.top_k=8 are never read by job.algorithm=dpo", DPO),
    ("entry_reads_no_online_knobs", [*DPO, "rl.kl_beta=0.1", "rollout.n=4"],
     "rollout.n=4, rl.kl_beta=0.1 are never read by job.algorithm=dpo (Diffusion DPO trains "
     "offline on dpo.pairs_path)", DPO),
    # The online loop's prompt rendering, sampling dtype and environment: no policy-only
    # entry reads them (SFT's rows carry their own system turn, tools and tool turns).
    ("entry_reads_no_online_knobs", [*SFT, "env.name=calculator", "env.max_turns=3",
     "env.max_context=100", "rollout.dtype=bfloat16", "data.prompt_truncation=left",
     "data.user_template=Q: {prompt}", "data.exact_digits=true", "data.allow_repeats=true"],
     "data.exact_digits=True, data.allow_repeats=True, data.user_template=Q: {prompt}, "
     "data.prompt_truncation=left, rollout.dtype=bfloat16, env.name=calculator, env.max_turns=3, "
     "env.max_context=100 are never read by job.algorithm=sft (SFT trains offline on "
     "sft.train_path)", SFT),
    ("section_read_only_by_its_entry", ["dpo.beta=2"],
     "dpo.beta=2.0 is read only by Diffusion DPO, not by job.algorithm=grpo; remove them or set "
     "job.algorithm=dpo", [*DPO, "dpo.beta=2"]),
    ("entry_policy_ranks", [*DPO, "placement.backend=ray", "placement.policy_ranks=2"],
     "the Diffusion DPO entry trains one policy rank", [*DPO, "placement.backend=ray"]),
    ("entry_policy_sharding", [*DPO, "placement.backend=ray", "placement.policy_sharding=fsdp"],
     "placement.policy_sharding=fsdp: the Diffusion DPO entry trains an unsharded policy",
     [*DPO, "placement.backend=ray", "placement.policy_ranks=1"]),
    ("entry_step_covers_ranks",
     [*SFT, "sft.rows_per_step=3", "placement.backend=ray", "placement.policy_ranks=4"],
     "sft.rows_per_step=3 gives some of placement.policy_ranks=4 no row; raise "
     "sft.rows_per_step to at least 4",
     [*SFT, "sft.rows_per_step=4", "placement.backend=ray", "placement.policy_ranks=4",
      "placement.policy_sharding=fsdp"]),
    ("entry_step_covers_ranks",
     [*LMDPO, "lmdpo.pairs_per_step=1", "placement.backend=ray", "placement.policy_ranks=2"],
     "lmdpo.pairs_per_step=1 gives some of placement.policy_ranks=2 no pair",
     [*LMDPO, "lmdpo.pairs_per_step=2", "placement.backend=ray", "placement.policy_ranks=2"]),
]  # fmt: skip


def test_every_rule_of_the_module_has_a_case():
    assert covered(CASES, entries)


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(name, bad, fragment, good):
    check_case(name, bad, fragment, good)


@pytest.mark.parametrize(
    ("algorithm", "family"),
    [
        ("grpo", "grpo"),
        ("gspo", "grpo"),
        ("opd", "opd"),
        ("opd_x", "opd"),
        ("dpo", "dpo"),
        ("sft", "sft"),
    ],
)
def test_objective_family(algorithm, family):
    assert objective_family(cfg([f"job.algorithm={algorithm}"])) == family


def test_the_family_is_the_registry_entry_the_label_starts_with():
    assert registry.family_of("anything") == registry.ENTRIES[0].name
    for e in registry.ENTRIES[1:]:
        assert registry.family_of(f"{e.name}_variant") == e.name


@pytest.mark.parametrize(
    ("entry", "algorithm", "fragment"),
    [("grpo", "opd", "run `posttrain opd"), ("grpo", "opd_x", "run `posttrain opd"),
     ("opd", "grpo", "run `posttrain grpo --config ...`"),
     ("opd", "gspo", "job.algorithm=gspo is a GRPO-family"),
     ("opd", "opd_direct", "the OPD entry records its runs as job.algorithm=opd"),
     ("dpo", "grpo", "which `posttrain dpo` does not train")],
)  # fmt: skip
def test_each_entry_refuses_the_other_family_in_one_line(entry, algorithm, fragment):
    with pytest.raises(PreflightError, match=fragment) as info:
        check_entry(cfg([f"job.algorithm={algorithm}"]), entry)
    assert "\n" not in str(info.value)
    check_entry(cfg([f"job.algorithm={'dr_grpo' if entry == 'grpo' else entry}"]), entry)


def test_an_override_a_policy_only_entry_never_reads_is_refused_even_at_its_default():
    with pytest.raises(PreflightError, match=r"rollout.n=8 is never read by job.algorithm=dpo"):
        refuse_unread_overrides(["rollout.n=8", "rl.lr=1e-3"], cfg(DPO))
    refuse_unread_overrides(["rollout.n=8"], cfg([]))  # an online entry reads it


def test_every_entry_module_and_builder_named_in_the_registry_exists():
    for e in registry.ENTRIES:
        module = registry.load(e.module)
        assert module.SPEC.name == e.name and callable(module.train_from_cli)
        if e.builder:
            assert callable(registry.load(e.builder))
        if e.rules:
            assert registry.load(e.rules).RULES
        if e.cli:
            cli = registry.load(e.cli)
            assert callable(cli.add_arguments) and callable(cli.dispatch)


def test_no_entry_name_starts_another_entrys_name():
    """A label belongs to the entry whose name it starts with (``family_of``), so no name may
    start with another's (``lmdpo`` is not ``dpo``'s: Diffusion DPO keeps ``dpo*``)."""
    names = registry.names()
    assert not [(a, b) for a in names for b in names if a != b and b.startswith(a)]
    assert registry.family_of("lmdpo") == "lmdpo" and registry.family_of("dpo") == "dpo"
