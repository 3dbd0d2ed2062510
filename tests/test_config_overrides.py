"""Dotlist overrides: typing, order, unknown-key suggestions, retired keys, malformed input."""

from __future__ import annotations

import pytest

from posttrain.config import (
    RETIRED,
    ConfigError,
    ConfigValueError,
    PosttrainConfig,
    RetiredKeyError,
    UnknownKeyError,
    apply_overrides,
    migration_lines,
)


def _apply(*opts: str) -> PosttrainConfig:
    return apply_overrides(PosttrainConfig(), list(opts))


@pytest.mark.parametrize(
    ("opt", "key", "expected"),
    [
        ("rl.lr=1e-3", "rl.lr", 1e-3),
        ("rl.lr=3", "rl.lr", 3.0),
        ("rl.epsilon_high=0.28", "rl.epsilon_high", 0.28),
        ("rl.max_steps=10", "rl.max_steps", 10),
        ("rl.unbiased_advantage=true", "rl.unbiased_advantage", True),
        ("rl.unbiased_advantage=False", "rl.unbiased_advantage", False),
        ("rl.loss_type=seq-mean-token-sum-fixed", "rl.loss_type", "seq-mean-token-sum-fixed"),
        ("rollout.max_tokens=17", "rollout.max_tokens", 17),
        ("data.operators=+-", "data.operators", "+-"),
        ("data.operators=-", "data.operators", "-"),
        ("job.name=007", "job.name", "007"),
        ("job.name='123'", "job.name", "123"),
        ("model.tokenizer_path=null", "model.tokenizer_path", None),
        ("model.tokenizer_path=~", "model.tokenizer_path", None),
        ("model.tokenizer_path='null'", "model.tokenizer_path", "null"),
        ("data.train_path=my data #1.jsonl", "data.train_path", "my data #1.jsonl"),
        ("placement.ray_address=", "placement.ray_address", ""),
        ("reward.functions=[a.b:c, d:e]", "reward.functions", ["a.b:c", "d:e"]),
        ("reward.functions=[]", "reward.functions", []),
        ("placement.gpus_per_role=0.5", "placement.gpus_per_role", 0.5),
    ],
)
def test_override_values_are_typed(opt, key, expected):
    section, field = key.split(".")
    value = getattr(getattr(_apply(opt), section), field)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    "opt",
    [
        "rollout.max_tokens=true",
        "rollout.max_tokens=2.5",
        "rollout.max_tokens=0",
        "rollout.max_tokens=-4",
        "rollout.max_tokens=ten",
        "rl.max_steps=1e3",
        "rl.unbiased_advantage=yes",
        "rl.unbiased_advantage=1",
        "rl.lr=fast",
        "rl.lr=[1,",
        "rl.lr=.inf",
        "rl.loss_type=token_mean",
        "rl.lower_bound_ratio=0.5",
        "reward.functions=mod:fn",
        "model.tokenizer_path=",
    ],
)
def test_bad_values_fail_naming_the_key(opt):
    key = opt.split("=")[0]
    with pytest.raises(ConfigValueError) as info:
        _apply(opt)
    assert key in str(info.value)
    assert "\n" not in str(info.value)


def test_later_overrides_win():
    cfg = _apply("rl.lr=0.1", "rl.max_steps=3", "rl.lr=0.2")
    assert cfg.rl.lr == 0.2 and cfg.rl.max_steps == 3


def test_overrides_apply_on_top_of_a_recipe_value():
    base = PosttrainConfig()
    base.rl.max_steps = 7
    assert apply_overrides(base, ["rl.lr=0.5"]).rl.max_steps == 7


@pytest.mark.parametrize(
    ("opt", "suggestion"),
    [
        ("rl.epsilon_lo=0.1", "rl.epsilon_low"),
        ("rl.epsilon_hgih=0.1", "rl.epsilon_high"),
        ("rollout.max_token=4", "rollout.max_tokens"),
        ("rll.lr=0.1", "rl.lr"),
        ("rl.kl_bta=0.1", "rl.kl_beta"),
        ("data.prompt_per_step=3", "data.prompts_per_step"),
        ("rollot.n=3", "rollout.n"),
    ],
)
def test_unknown_key_suggests_the_nearest(opt, suggestion):
    key = opt.split("=")[0]
    with pytest.raises(UnknownKeyError) as info:
        _apply(opt)
    assert str(info.value) == f"unknown config key '{key}': did you mean {suggestion}?"


def test_unknown_key_without_a_near_match_points_to_the_reference():
    with pytest.raises(UnknownKeyError, match="docs/reference/config.md"):
        _apply("qqqq.zzzz=1")


@pytest.mark.parametrize("line", migration_lines())
def test_every_retired_key_fails_with_its_exact_replacement(line):
    old, new = line.split(" -> ")
    with pytest.raises(RetiredKeyError) as info:
        _apply(old)
    assert str(info.value) == (
        f"config key '{old.split('=')[0]}' is retired: write {new} instead of {old}"
    )


def test_migration_table_is_the_documented_one():
    assert migration_lines() == [
        "rl.objective=degenerate -> rl.grpo_surrogate=legacy_pg",
        "rl.objective=clipped -> rl.grpo_surrogate=clipped",
        "rl.objective_mode=direct -> rl.distillation_mode=direct",
        "rl.objective_mode=advantage -> rl.distillation_mode=advantage",
    ]
    assert set(RETIRED) == {"rl.objective", "rl.objective_mode"}


@pytest.mark.parametrize("opt", ["rl.objective=ppo", "rl.objective_mode=x"])
def test_retired_key_with_an_unknown_value_lists_the_migration(opt):
    key = opt.split("=")[0]
    with pytest.raises(RetiredKeyError, match=f"'{key}' is retired and replaced by"):
        _apply(opt)


def test_retired_keys_are_not_aliases():
    cfg = PosttrainConfig()
    with pytest.raises(RetiredKeyError):
        apply_overrides(cfg, ["rl.grpo_surrogate=clipped", "rl.objective=degenerate"])
    assert cfg.rl.grpo_surrogate == "clipped"


@pytest.mark.parametrize(
    ("opt", "fragment"),
    [
        ("rl.lr", "not of the form section.key=value"),
        ("=3", "not of the form"),
        ("rl=3", "names a whole section"),
        ("+rl.lr=0.1", "every key already exists; write rl.lr=0.1"),
        ("~rl.lr", "every key exists; write rl.lr=@default to reset it"),
        ("rl.lr", "or section.key=@default"),
    ],
)
def test_malformed_overrides(opt, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("+", r"\+").replace(".", r"\.")):
        _apply(opt)


def test_reset_to_default_restores_the_schema_default():
    cfg = _apply("data.digits=5", "data.operators=+-", "model.tokenizer_path=tok", "rl.lr=1e-3")
    apply_overrides(cfg, ["data.digits=@default", "data.operators=@default"])
    apply_overrides(cfg, ["model.tokenizer_path=@default", "reward.functions=@default"])
    assert (cfg.data.digits, cfg.data.operators) == (2, "+")
    assert cfg.model.tokenizer_path is None and cfg.reward.functions == []
    assert cfg.rl.lr == 1e-3  # untouched keys keep their value
    assert (
        _apply(
            "data.reasoning_gym_options={a: 1}", "data.reasoning_gym_options=@default"
        ).data.reasoning_gym_options
        == {}
    )


def test_reset_of_an_unknown_key_suggests_the_nearest():
    with pytest.raises(UnknownKeyError, match="did you mean data.digits"):
        _apply("data.digit=@default")
