"""The read declarations themselves (algorithm/primitives/reads.py): union, partials, bad keys."""

from __future__ import annotations

import functools

import pytest

from posttrain.algorithm import grpo, opd
from posttrain.algorithm.primitives.reads import Reads, declare_reads, declared_reads, reads_of
from posttrain.config import PosttrainConfig, apply_overrides


@declare_reads("rl.temperature", grpo.reads)
def _wrapper(rl, context, extra=0):
    return None


def test_union_is_named_after_the_builder_and_read_keys_leave_unread():
    legacy = apply_overrides(PosttrainConfig(), ["rl.grpo_surrogate=legacy_pg"])
    out = declared_reads(_wrapper)(legacy)
    assert out.by == f"the objective builder {__name__}:_wrapper"
    assert out.reads("rl.temperature") and out.reads("rl.grpo_surrogate")
    assert "rl.temperature" not in out.unread and out.unread["rl.kl_beta"] == "no KL term"


def test_a_builtin_forwarding_declaration_keeps_the_builtins_name():
    assert declared_reads(grpo.make_objective)(PosttrainConfig()).by == "rl.grpo_surrogate=clipped"


def test_partials_carry_the_declaration_and_undeclared_falls_back_to_the_builtin():
    cfg = PosttrainConfig()
    assert declared_reads(functools.partial(_wrapper, extra=1)) is declared_reads(_wrapper)
    assert reads_of(cfg, lambda rl, c: None, opd.make_objective) == opd.reads(cfg)


def test_reads_union_operator():
    a = Reads(frozenset({"rl.lr"}), "a", {"rl.kl_beta": "no KL"})
    b = Reads(frozenset({"rl.kl_beta"}), "b", {"rl.epsilon_low": "no clip"})
    assert a | b == Reads(frozenset({"rl.lr", "rl.kl_beta"}), "a", {"rl.epsilon_low": "no clip"})


def test_a_declaration_names_dotted_keys():
    with pytest.raises(ValueError, match="not dotted config keys"):
        declare_reads("kl_beta")
