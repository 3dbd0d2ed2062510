"""User reward functions loaded from 'module:function' specs."""

from __future__ import annotations

import re
import textwrap

import pytest

from posttrain.reward import RewardFunctionSpecError, load_reward_function

USER_MODULE = textwrap.dedent(
    """
    import functools

    def length_bonus(prompt, completion, answer, meta):
        return 0.1 * len(completion)

    def two_args(prompt, completion):
        return 0.0

    def _make():
        def inner(prompt, completion, answer, meta):
            return 1.0
        return inner

    nested = _make()
    anon = lambda prompt, completion, answer, meta: 1.0  # noqa: E731
    NOT_CALLABLE = 3

    class Scorer:
        def __call__(self, prompt, completion, answer, meta):
            return 2.0

    scorer = Scorer()
    def scaled(k, prompt, completion, answer, meta):
        return k * len(answer)

    partial_fn = functools.partial(scaled, 5.0)
    partial_lambda = functools.partial(lambda k, p, c, a, m: k, 5.0)
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def test_loads_module_level_function(user_module):
    f = load_reward_function(f"{user_module}:length_bonus")
    assert f.spec == "my_rewards:length_bonus"
    assert f("p", "abcd", "a", {}) == pytest.approx(0.4)
    assert load_reward_function(f"{user_module}:scorer")("p", "c", "a", {}) == 2.0
    assert load_reward_function(f"{user_module}:partial_fn")("p", "c", "ab", {}) == 10.0


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("my_rewards", "expected 'module:function' (one colon)"),
        ("a:b:c", "one colon"),
        (":length_bonus", "with a module path"),
        ("my_rewards:Scorer.__call__", "no dotted attribute"),
        ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
        ("my_rewards:missing", "has no attribute 'missing'; define fn(prompt, completion"),
        ("my_rewards:NOT_CALLABLE", "'NOT_CALLABLE' is a int, not a function"),
        ("my_rewards:Scorer", "'Scorer' is a type, not a function"),
        ("my_rewards:anon", "a lambda or nested function"),
        ("my_rewards:nested", "'_make.<locals>.inner'"),
        ("my_rewards:partial_lambda", "wraps '<lambda>', a lambda or nested function"),
        ("my_rewards:two_args", "cannot be called as fn(prompt, completion, answer, meta)"),
    ],
)
def test_bad_specs(user_module, spec, needle):
    with pytest.raises(RewardFunctionSpecError, match=re.escape(needle)):
        load_reward_function(spec)
