"""The ``env`` section: strict values, the preflight load check, one-line errors."""

from __future__ import annotations

import pytest
from cli_here import posttrain_here

from posttrain.config import ConfigError, PosttrainConfig, load_config
from posttrain.control import PreflightError, run_preflight


def test_single_turn_is_the_default() -> None:
    env = PosttrainConfig().env
    assert env.name == "" and not env.enabled and env.tools == []


@pytest.mark.parametrize(
    ("opt", "line"),
    [
        ("env.name=calculater", "invalid config value env.name: 'calculater' is neither a "
         "built-in environment (calculator, calculator_compact, tools) nor a 'module:function' reference"),
        ("env.max_turns=0", "env.max_turns: Input should be greater than or equal to 1"),
        ("env.max_context=1", "env.max_context: Input should be greater than or equal to 2"),
        ("env.tools=[nocolon]", "env.tools: 'nocolon' is not a 'module:function' reference"),
        ("env.max_turn=3", "unknown config key 'env.max_turn': did you mean env.max_turns?"),
    ],
)  # fmt: skip
def test_bad_values_fail_in_one_line(opt: str, line: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config("arithmetic", ["--", opt])
    assert line in str(e.value) and "\n" not in str(e.value)


def _preflight(**env) -> str:
    cfg = PosttrainConfig(env=env)
    with pytest.raises(PreflightError) as e:
        run_preflight(cfg)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_preflight_imports_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert "cannot import module 'no_such_env'" in _preflight(name="no_such_env:make")
    assert "names no tools" in _preflight(name="tools")
    assert "env.tools is read only with env.name=tools" in _preflight(
        tools=["posttrain.env.calculator:calculator"]
    )
    (tmp_path / "bad_env.py").write_text("def make():\n    return 3\n")
    assert "returned a int without reset and step" in _preflight(name="bad_env:make")
    (tmp_path / "keyed_env.py").write_text(
        "from posttrain.env.tools import calculator_environment\n"
        "def make():\n    env = calculator_environment()\n"
        "    env.info_keys = ('tool_calls', 'reward')\n    return env\n"
    )
    assert (
        "environment 'keyed_env:make': info key 'reward' is reserved (the driver's own "
        "dropped_observations, env_tokens, policy_tokens, reward, truncation, turns); rename it"
    ) in _preflight(name="keyed_env:make")


def test_preflight_accepts_builtin_and_tools_environments() -> None:
    for env in ({"name": "calculator"},
                {"name": "tools", "tools": ["posttrain.env.calculator:calculator"]}):  # fmt: skip
        run_preflight(PosttrainConfig(env=env))


@pytest.mark.parametrize(
    ("section", "line"),
    [({"rollout": {"engine": "static"}}, "env.name=calculator needs rollout.engine=torch"),
     ({"reward": {"overlong_buffer": 4}}, "set reward.overlong_buffer=0 (env.max_context")],
)  # fmt: skip
def test_settings_without_a_multiturn_meaning_are_refused(section, line) -> None:
    cfg = PosttrainConfig(env={"name": "calculator"}, **section)
    with pytest.raises(PreflightError) as e:
        run_preflight(cfg)
    assert line in str(e.value) and "\n" not in str(e.value)


def test_cli_names_a_missing_environment_in_one_line(tmp_path) -> None:
    out = posttrain_here(["grpo", "--config", "arithmetic", "--", f"job.output_root={tmp_path}",
                          "env.name=missing_env:make"], tmp_path)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.strip().count("\n") == 0
    assert "cannot import module 'missing_env'" in out.stderr


def test_a_factory_that_raises_is_one_line_naming_it_and_its_exception(tmp_path) -> None:
    """Issue 33 item 2: a raising factory gave a 39-line traceback from `config show`."""
    (tmp_path / "bad_env.py").write_text('def broken():\n    raise RuntimeError("x")\n')
    out = posttrain_here(["config", "show", "--config", "arithmetic", "--",
                          "env.name=bad_env:broken"], tmp_path)  # fmt: skip
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert "Traceback" not in out.stderr and out.stderr.strip().count("\n") == 0, out.stderr
    assert (
        "environment 'bad_env:broken': the factory raised RuntimeError: x; fix the factory"
    ) in out.stderr


def test_a_factory_raising_type_error_inside_is_not_called_an_arity_error(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "typo_env.py").write_text("def make():\n    return len(3)\n")
    line = _preflight(name="typo_env:make")
    assert "the factory raised TypeError: object of type 'int' has no len()" in line
    (tmp_path / "arity_env.py").write_text("def make(size):\n    return size\n")
    assert "cannot be called with no arguments" in _preflight(name="arity_env:make")
