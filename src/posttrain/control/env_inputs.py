"""The environment's side of preflight: what a multi-turn run renders, checked with the tokenizer.

A multi-turn run renders every turn with the tokenizer's chat template, and its opening prompt
is the environment's ``reset`` rendered by that template, so neither can be judged from the
config alone. Here the tokenizer is loaded (its files only, never the model; for a model that
``model.init_preset`` has not built yet, the preset's own tokenizer), the template is probed
(:func:`posttrain.env.render.check_template`) and the opening prompts of the first rows are
measured against ``env.max_context``. ``posttrain config show`` and a run (before its run
directory is touched) both run it, so a template without tool turns or a context that leaves no
room for a turn is one line before any model loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain.config import ConfigError, PosttrainConfig
from posttrain.data.tasks import TaskSource
from posttrain.env.base import (
    EnvironmentSpecError,
    check_messages,
    environment_tools,
    load_environment,
    make_environment,
)
from posttrain.env.host import env_item
from posttrain.env.render import TemplateError, check_template, encode, render

#: Rows whose opening prompt is measured (the first step's, in the run's order, and held-out).
PROMPT_ROWS = 32


def run_tokenizer(config: PosttrainConfig) -> tuple[Any, str] | None:
    """The tokenizer a run will use and the key that names it, read without the model; None
    when there is none to read yet (a folder that loading the model will report missing)."""
    from posttrain.model.tiny import preset_tokenizer
    from posttrain.model.tokenizer import load_tokenizer

    m = config.model
    key = "model.tokenizer_path" if m.tokenizer_path else "model.name_or_path"
    path = Path(m.tokenizer_path or m.name_or_path)
    if (path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file():
        return load_tokenizer(path), f"{key}={str(path)!r}"
    if m.init_preset and not m.tokenizer_path and not (path / "config.json").exists():
        return preset_tokenizer(m.init_preset), f"model.init_preset={m.init_preset}"
    return None


def check_environment_inputs(config: PosttrainConfig, tasks: TaskSource) -> None:
    """Refuse, in one line naming the tokenizer and the fix, a multi-turn run whose template
    cannot render its turns exactly or whose ``env.max_context`` leaves no room for a turn."""
    env = config.env
    if not env.name:
        return
    found = run_tokenizer(config)
    if found is None:
        return
    tokenizer, where = found
    tools = environment_tools(make_environment(load_environment(env.name, env.tools), env.name))
    try:
        check_template(tokenizer, tools)
    except TemplateError as e:
        raise TemplateError(f"env.name={env.name} with the tokenizer of {where}: {e}") from None
    rows = tasks.take(config.job.seed, 0, min(PROMPT_ROWS, len(tasks)))[0]
    rows += tasks.val_items()[:PROMPT_ROWS]
    longest, row = 0, ""
    factory = load_environment(env.name, env.tools)
    for item in rows:  # a fresh environment per row, as the episode driver makes them
        try:
            messages = make_environment(factory, env.name).reset(env_item(item))
        except ConfigError:
            raise
        except Exception as e:  # the user's reset failed on a row
            raise EnvironmentSpecError(
                f"environment {env.name!r}: reset raised {type(e).__name__}: {e} on row "
                f"{item.item_id}; fix the environment"
            ) from e
        messages = check_messages(messages, f"environment {env.name!r} on row {item.item_id}")
        n = len(encode(tokenizer, render(tokenizer, messages, tools, generation_prompt=True)))
        if n > longest:
            longest, row = n, item.item_id
    if longest >= env.max_context:
        raise ConfigError(
            f"env.max_context={env.max_context} leaves no room for a turn: the environment's "
            f"opening prompt is {longest} tokens (row {row}, with the tokenizer of {where}); "
            f"set env.max_context to at least {longest + config.rollout.max_tokens} (the prompt "
            f"and one turn of rollout.max_tokens={config.rollout.max_tokens})"
        )
