"""Rules that read beyond the config: the user's reward modules and the tokenizer's files.

Both would otherwise fail only after placement has loaded a model; here they cost an import and
a small JSON read.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import error
from posttrain.rollout.registry import engine_capabilities, engines_with


@error("reward.functions")
def reward_functions_load(cfg: PosttrainConfig) -> str | None:
    """Every reward.functions entry imports (working directory first, as with python -m),
    names a module-level function and accepts (prompt, completion, answer, meta)."""
    if not cfg.reward.functions:
        return None
    from posttrain.reward.functions import RewardFunctionSpecError, load_reward_function

    problems: list[str] = []
    for i, spec in enumerate(cfg.reward.functions):
        if spec in cfg.reward.functions[:i]:
            problems.append(f"reward.functions lists {spec!r} twice; remove one")
            continue
        try:
            load_reward_function(spec)
        except RewardFunctionSpecError as e:
            problems.append(str(e))
    return "; ".join(problems) or None


def chat_template_in(tokenizer_dir: Path) -> bool | None:
    """Whether the saved tokenizer in ``tokenizer_dir`` carries a chat template; None when the
    directory holds no tokenizer config to read (yet)."""
    if (tokenizer_dir / "chat_template.jinja").is_file():
        return True
    config = tokenizer_dir / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None  # unreadable here: loading the tokenizer will report it with its own error
    return bool(data.get("chat_template")) if isinstance(data, dict) else None


@error("data.prompt_template", "model.name_or_path", "model.tokenizer_path", "model.init_preset")
def chat_template_available(cfg: PosttrainConfig) -> str | None:
    """data.prompt_template=chat renders the tokenizer's own chat template; a tokenizer without
    one is found from its saved files, without loading the model."""
    if cfg.data.prompt_template != "chat":
        return None
    key = "model.tokenizer_path" if cfg.model.tokenizer_path else "model.name_or_path"
    path = Path(cfg.model.tokenizer_path or cfg.model.name_or_path)
    found = chat_template_in(path)
    if found:
        return None
    if found is None:
        builds_char_tokenizer = (
            cfg.model.init_preset is not None
            and key == "model.name_or_path"
            and not (path / "config.json").exists()
        )
        if not builds_char_tokenizer:
            return None  # nothing saved there yet; loading the model reports a missing directory
        from posttrain.model.presets import PRESETS

        preset = PRESETS.get(cfg.model.init_preset)
        if preset is not None and preset.tools:
            return None  # a tools preset's tokenizer carries the tools chat template
        return (
            f"data.prompt_template=chat needs a chat template, but model.init_preset="
            f"{cfg.model.init_preset} builds a character-level tokenizer without one at "
            f"{key}={str(path)!r}; use data.prompt_template=plain"
        )
    return (
        f"data.prompt_template=chat needs a tokenizer with a chat template, and {key}="
        f"{str(path)!r} has none (no chat_template in tokenizer_config.json, no "
        "chat_template.jinja); use data.prompt_template=plain or a tokenizer that has one"
    )


@error("env.name", "env.tools", "rollout.engine", "reward.overlong_buffer")
def environment_loads(cfg: PosttrainConfig) -> str | None:
    """env.name imports (working directory first) and builds an environment with reset and step;
    env.tools is given exactly when env.name=tools; multi-turn sampling needs an engine that
    declares multi-turn (it continues each trajectory from its KV cache or prefix cache); the
    overlong ramp has no trajectory bound to ramp to."""
    env = cfg.env
    if env.name and cfg.reward.overlong_buffer:
        return (
            f"reward.overlong_buffer={cfg.reward.overlong_buffer} ramps over the last tokens "
            "before rollout.max_tokens, which bounds one turn of an env.name run, not the "
            "trajectory; set reward.overlong_buffer=0 (env.max_context bounds the trajectory)"
        )
    if env.name and not engine_capabilities(cfg.rollout.engine).multi_turn:
        able = "|".join(engines_with(multi_turn=True))
        return (
            f"env.name={env.name} needs rollout.engine={able} (an engine that declares multi-turn "
            f"continuation), got rollout.engine={cfg.rollout.engine}"
        )
    if not env.name:
        return (
            "env.tools is read only with env.name=tools; set env.name=tools" if env.tools else None
        )
    from posttrain.env.base import EnvironmentSpecError, check_environment

    try:
        check_environment(env.name, env.tools)
    except EnvironmentSpecError as e:
        return str(e)
    return None


RULES = (reward_functions_load, chat_template_available, environment_loads)
