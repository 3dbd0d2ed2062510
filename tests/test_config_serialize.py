"""Round trip (YAML, JSON, overrides) and the provenance identity hash."""

from __future__ import annotations

import json
import typing
from typing import Any, Literal

import annotated_types as at
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.config import (
    ConfigError,
    PosttrainConfig,
    RetiredKeyError,
    UnknownKeyError,
    apply_overrides,
    from_dict,
    from_json,
    from_yaml,
    to_dict,
    to_json,
    to_yaml,
)
from posttrain.config.serialize import CoreDumper

_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), min_size=1, max_size=12)
_SCALAR = st.integers(-100, 100) | st.booleans() | st.from_regex(r"[a-z]{0,5}", fullmatch=True)
_SPECIAL: dict[str, st.SearchStrategy] = {
    "job.name": st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,10}", fullmatch=True),
    "job.algorithm": st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,10}", fullmatch=True),
    "data.operators": st.permutations("+-*").flatmap(
        lambda p: st.integers(1, 3).map(lambda k: "".join(p[:k]))
    ),
    "reward.functions": st.lists(
        st.from_regex(r"[a-z_][a-z0-9_.]{0,6}:[a-z_][a-z0-9_]{0,6}", fullmatch=True), max_size=3
    ),
    "env.name": st.sampled_from(["", "calculator", "tools"])
    | st.from_regex(r"[a-z_][a-z0-9_.]{0,6}:[a-z_][a-z0-9_]{0,6}", fullmatch=True),
    "env.tools": st.lists(
        st.from_regex(r"[a-z_][a-z0-9_.]{0,6}:[a-z_][a-z0-9_]{0,6}", fullmatch=True), max_size=3
    ),
    "rl.objective_builder": st.none()
    | st.from_regex(
        r"[a-z_][a-z0-9_]{0,6}(\.[a-z_][a-z0-9_]{0,4})?:[a-z_][a-z0-9_]{0,6}", fullmatch=True
    ),
    "data.reasoning_gym_options": st.dictionaries(
        st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
        _SCALAR | st.lists(_SCALAR, max_size=3),
        max_size=3,
    ),
    # The question's placeholder exactly once, any text around it.
    "data.user_template": st.tuples(_TEXT | st.just(""), _TEXT | st.just("")).map(
        lambda t: f"{t[0]}{{prompt}}{t[1]}"
    ),
    "model.lora_target_modules": st.lists(
        st.from_regex(r"[a-z_][a-z0-9_.]{0,8}", fullmatch=True), min_size=1, max_size=4
    ),
    "rl.lower_bound_ratio": st.one_of(st.just(0.0), st.floats(1.0, 100.0, exclude_min=True)),
    "placement.device": st.from_regex(r"auto|cpu|cuda|cuda:[0-9]{1,2}", fullmatch=True),
}


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    for m in metadata:
        if isinstance(m, at.Gt):
            kw.update(min_value=m.gt, exclude_min=True)
        elif isinstance(m, at.Ge):
            kw["min_value"] = m.ge
        elif isinstance(m, at.Lt):
            kw.update(max_value=m.lt, exclude_max=True)
        elif isinstance(m, at.Le):
            kw["max_value"] = m.le
    return kw


def _strategy(key: str, info) -> st.SearchStrategy:
    if key in _SPECIAL:
        return _SPECIAL[key]
    ann, kw = info.annotation, _bounds(info.metadata)
    if typing.get_origin(ann) is Literal:
        return st.sampled_from(typing.get_args(ann))
    args = typing.get_args(ann)
    if type(None) in args and len(args) == 2 and typing.get_origin(args[0]) is Literal:
        return st.none() | st.sampled_from(typing.get_args(args[0]))
    if ann is bool:
        return st.booleans()
    if ann is int or set(args) == {int, type(None)}:
        low = kw.get("min_value", -(2**40)) + (1 if kw.get("exclude_min") else 0)
        ints = st.integers(low, kw.get("max_value", 2**40))
        return ints if ann is int else st.none() | ints
    if ann is float:
        exclusive = {"exclude_min": kw.pop("exclude_min", False)}
        exclusive["exclude_max"] = kw.pop("exclude_max", False)
        return st.floats(
            kw.get("min_value", -1e6), kw.get("max_value", 1e6), allow_nan=False, **exclusive
        )
    if ann is str:
        return _TEXT
    if ann == str | None:
        return st.none() | _TEXT
    raise AssertionError(f"no strategy for {key}: {ann}")


@st.composite
def configs(draw) -> PosttrainConfig:
    data: dict[str, dict[str, Any]] = {}
    for name, section in PosttrainConfig.sections().items():
        fields = section.model_fields
        chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=6))
        data[name] = {f: draw(_strategy(f"{name}.{f}", fields[f])) for f in chosen}
    return from_dict(data)


def _override_text(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)  # a double-quoted YAML scalar
    return yaml.dump(value, Dumper=CoreDumper, default_flow_style=True).removesuffix("\n...\n")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_yaml_and_json_round_trip(cfg):
    assert from_yaml(to_yaml(cfg)) == cfg
    assert from_json(to_json(cfg)) == cfg
    assert to_yaml(from_yaml(to_yaml(cfg))) == to_yaml(cfg)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_every_value_survives_an_override(cfg):
    opts = [
        f"{section}.{key}={_override_text(value)}"
        for section, body in to_dict(cfg).items()
        for key, value in body.items()
    ]
    assert apply_overrides(PosttrainConfig(), opts) == cfg


def test_yaml_uses_core_scalars():
    cfg = PosttrainConfig()
    cfg.job.name = "1e-3"
    cfg.model.tokenizer_path = "yes"
    cfg.rl.lr = 1e-7
    text = to_yaml(cfg)
    assert "name: '1e-3'" in text and "tokenizer_path: yes" in text and "lr: 1.0e-07" in text
    assert from_yaml(text) == cfg
    assert from_yaml("rl:\n  lr: 1e-3\n").rl.lr == 1e-3


def test_missing_keys_take_defaults():
    assert from_yaml("") == PosttrainConfig()
    assert from_yaml("rl:\n  max_steps: 9\n").rollout == PosttrainConfig().rollout


@pytest.mark.parametrize(
    ("text", "error", "fragment"),
    [
        ("rl:\n  epsilon_lo: 0.1\n", UnknownKeyError, "did you mean rl.epsilon_low?"),
        ("rll:\n  lr: 0.1\n", UnknownKeyError, "did you mean rl?"),
        ("rl:\n  objective: degenerate\n", RetiredKeyError, "rl.grpo_surrogate=legacy_pg"),
        ("rl: 3\n", ConfigError, "must be a mapping"),
        ("- 1\n", ConfigError, "mapping of sections"),
        ("rl: [\n", ConfigError, "does not parse"),
        ("rollout:\n  max_tokens: 2.5\n", ConfigError, "rollout.max_tokens"),
    ],
)
def test_bad_yaml_fails_in_one_line(text, error, fragment):
    with pytest.raises(error) as info:
        from_yaml(text)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_nested_errors_are_reported_once_with_the_full_key():
    with pytest.raises(ConfigError) as info:
        from_dict({"rollout": {"max_tokens": 0}})
    assert str(info.value) == (
        "invalid config value rollout.max_tokens: Input should be greater than 0 (got 0)"
    )


def test_line_break_characters_round_trip():
    # Regression: PyYAML emitted U+0085 / U+2028 unescaped inside quotes with allow_unicode.
    cfg = PosttrainConfig()
    cfg.logging.wandb_project = "a\x85b\u2028c"
    assert from_yaml(to_yaml(cfg)) == cfg
