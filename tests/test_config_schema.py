"""Schema: defaults, strict typing, field ranges, documentation, assignment validation."""

from __future__ import annotations

import pytest

from posttrain.config import (
    ConfigError,
    ConfigValueError,
    PosttrainConfig,
    RetiredKeyError,
    RLConfig,
    RolloutConfig,
    UnknownKeyError,
    all_keys,
)
from posttrain.run.records import default_out_dir


def test_defaults_build_and_every_field_is_documented():
    cfg = PosttrainConfig()
    assert cfg.rl.grpo_surrogate == "clipped"
    assert cfg.rl.loss_type == "token-mean"
    assert cfg.job.output_root == "outputs"
    for name, section in PosttrainConfig.sections().items():
        assert section.__doc__, name
        for field, info in section.model_fields.items():
            assert info.description and len(info.description) > 10, f"{name}.{field}"


def test_all_keys_are_dotted_and_unique():
    keys = all_keys()
    assert len(keys) == len(set(keys))
    assert "rl.epsilon_low" in keys and "rollout.max_tokens" in keys
    assert all(k.count(".") == 1 for k in keys)


@pytest.mark.parametrize("bad", [True, False, 2.5, 4.0, 0, -3, "4", None])
def test_max_tokens_is_a_strict_positive_int(bad):
    with pytest.raises(ConfigValueError, match=r"rollout\.max_tokens"):
        RolloutConfig(max_tokens=bad)
    cfg = PosttrainConfig()
    with pytest.raises(ConfigValueError, match=r"rollout\.max_tokens"):
        cfg.rollout.max_tokens = bad
    assert cfg.rollout.max_tokens == 256  # a rejected assignment leaves the old value


def test_max_tokens_accepts_positive_ints():
    assert RolloutConfig(max_tokens=1).max_tokens == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lower_bound_ratio", 0.5),
        ("lower_bound_ratio", 1.0),
        ("lower_bound_ratio", -1.0),
        ("epsilon_low", 1.0),
        ("epsilon_low", 0.0),
        ("epsilon_high", 0.0),
        ("temperature", 0.0),
        ("lr", float("inf")),
        ("lr", float("nan")),
        ("kl_beta", -0.1),
        ("mini_batch_per_replica", 0),
        ("micro_batch_size", 0),
        ("grad_clip", -1.0),
        ("loss_type", "token-sum"),
        ("resume", "yes"),
        ("advantage_estimator", "unbiased"),
        ("reward_scaling", "global"),
        ("entropy_coef", -0.1),
        ("entropy_coef", float("inf")),
        ("max_steps", True),
    ],
)
def test_rl_rejects_out_of_range(field, value):
    with pytest.raises(ConfigValueError, match=rf"rl\.{field}"):
        RLConfig(**{field: value})


@pytest.mark.parametrize("value", [0.0, 1.5, 3.0])
def test_lower_bound_ratio_accepts_off_or_dual_clip(value):
    assert RLConfig(lower_bound_ratio=value).lower_bound_ratio == value


def test_float_fields_accept_ints_and_store_floats():
    rl = RLConfig(lr=1, temperature=2)
    assert rl.lr == 1.0 and isinstance(rl.lr, float) and isinstance(rl.temperature, float)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("rollout.n", 1),
        ("rollout.top_p", 0.0),
        ("rollout.top_p", 1.5),
        ("rollout.engine", "sglang"),
        ("data.operators", "+/"),
        ("data.operators", "++"),
        ("data.operators", ""),
        ("data.digits", 0),
        ("data.task", "gsm8k"),
        ("job.name", "a/b"),
        ("job.name", ""),
        ("job.algorithm", "../x"),
        ("job.seed", -1),
        ("model.dtype", "float16"),
        ("reward.functions", ["not a ref"]),
        ("reward.functions", "mod:fn"),
        ("reward.format_weight", -1.0),
        ("placement.backend", "slurm"),
        ("logging.wandb_mode", "on"),
        ("checkpoint.keep_last", 0),
    ],
)
def test_sections_reject_bad_values(key, value):
    section, field = key.split(".")
    cfg = PosttrainConfig()
    with pytest.raises(ConfigValueError) as info:
        setattr(getattr(cfg, section), field, value)
    assert key in str(info.value)
    assert "\n" not in str(info.value)


def test_reward_functions_accept_module_function_refs():
    cfg = PosttrainConfig()
    cfg.reward.functions = ["pkg.mod:score", "m:f"]
    assert cfg.reward.functions == ["pkg.mod:score", "m:f"]


def test_unknown_attribute_on_a_section_suggests_the_field():
    cfg = PosttrainConfig()
    with pytest.raises(UnknownKeyError, match=r"did you mean rl\.epsilon_low\?"):
        cfg.rl.epsilon_lo = 0.1
    with pytest.raises(UnknownKeyError, match="unknown config key 'rl.zzzzzz'"):
        cfg.rl.zzzzzz = 1
    with pytest.raises(UnknownKeyError, match=r"did you mean rollout\?"):
        cfg.rollot = None


def test_retired_attribute_in_a_recipe_names_its_replacement():
    cfg = PosttrainConfig()
    with pytest.raises(RetiredKeyError, match=r"rl\.grpo_surrogate=legacy_pg"):
        cfg.rl.objective = "degenerate"


def test_constructor_errors_are_one_line_config_errors():
    with pytest.raises(ConfigError) as info:
        PosttrainConfig(rl={"lr": "fast", "max_steps": 0})
    message = str(info.value)
    assert "rl.lr" in message and "rl.max_steps" in message and "\n" not in message


def test_default_of_and_is_default():
    rl = RLConfig()
    assert RLConfig.default_of("epsilon_high") == 0.2
    assert rl.is_default("epsilon_high")
    rl.epsilon_high = 0.28
    assert not rl.is_default("epsilon_high")


def test_run_dir_separates_algorithm_and_name():
    cfg = PosttrainConfig()
    cfg.job.output_root, cfg.job.algorithm, cfg.job.name = "out", "gspo", "run1"
    assert str(default_out_dir(cfg)) == "out/gspo/run1"
