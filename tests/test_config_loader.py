"""load_config: recipe files, built-in names, saved configs, the `--` list, recipe errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.config import (
    RECIPE_BUILDER,
    ConfigError,
    PosttrainConfig,
    RecipeError,
    UnknownKeyError,
    builtin_recipes,
    load_config,
    to_json,
    to_yaml,
)
from posttrain.config.loader import BUILTIN_RECIPES

RECIPE = """
from posttrain.config import PosttrainConfig

def build_config():
    cfg = PosttrainConfig()
    cfg.job.name = "from_file"
    cfg.rl.max_steps = 5
    return cfg
"""


def _write(tmp_path: Path, text: str, name: str = "recipe.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_builder_name_is_documented_constant():
    assert RECIPE_BUILDER == "build_config"


def test_load_recipe_file_with_dashdash_overrides(tmp_path):
    path = _write(tmp_path, RECIPE)
    cfg = load_config(path, ["--", "rl.max_steps=9", "rl.lr=0.5"])
    assert (cfg.job.name, cfg.rl.max_steps, cfg.rl.lr) == ("from_file", 9, 0.5)
    assert load_config(str(path)).rl.max_steps == 5
    assert load_config(path, ["rl.max_steps=2"]).rl.max_steps == 2  # bare list: all overrides


def test_only_items_after_the_first_dashdash_are_overrides(tmp_path):
    path = _write(tmp_path, RECIPE)
    with pytest.raises(UnknownKeyError, match="did you mean rl.lr"):
        load_config(path, ["--config", "x", "--", "rl.lrr=1"])
    assert load_config(path, ["--config", "x", "--"]).rl.max_steps == 5


def test_each_load_builds_a_fresh_config(tmp_path):
    path = _write(tmp_path, RECIPE)
    first = load_config(path, ["--", "rl.max_steps=1"])
    assert load_config(path).rl.max_steps == 5 and first.rl.max_steps == 1


def test_builtin_recipe_by_name_equals_by_path():
    assert "arithmetic" in builtin_recipes()
    assert load_config("arithmetic") == load_config(BUILTIN_RECIPES / "arithmetic.py")


@pytest.mark.parametrize("dump", [to_yaml, to_json])
def test_saved_resolved_config_loads_back(tmp_path, dump):
    cfg = load_config("arithmetic", ["--", "rl.max_steps=3"])
    suffix = ".yaml" if dump is to_yaml else ".json"
    path = _write(tmp_path, dump(cfg), "resolved" + suffix)
    assert load_config(path) == cfg
    assert load_config(path, ["--", "rl.max_steps=4"]).rl.max_steps == 4


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("x = 1\n", "defines no build_config() function"),
        ("def build_config():\n    return {}\n", "returned dict, not PosttrainConfig"),
        ("import no_such_module_xyz\n", "failed to import: ModuleNotFoundError"),
        ("def build_config():\n    return 1 / 0\n", "build_config() failed: ZeroDivisionError"),
    ],
)
def test_broken_recipes_raise_recipe_errors(tmp_path, text, fragment):
    with pytest.raises(RecipeError) as info:
        load_config(_write(tmp_path, text))
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_config_error_inside_a_recipe_propagates_unchanged(tmp_path):
    text = RECIPE.replace("cfg.rl.max_steps = 5", "cfg.rl.epsilon_lo = 0.1")
    with pytest.raises(UnknownKeyError, match="did you mean rl.epsilon_low"):
        load_config(_write(tmp_path, text))


def test_missing_config_lists_builtins(tmp_path):
    with pytest.raises(
        RecipeError, match="neither a file nor a built-in recipe; built-in recipes: arithmetic, "
    ):
        load_config(tmp_path / "nope.py")
    with pytest.raises(RecipeError, match="expected a .py recipe"):
        load_config(_write(tmp_path, "x", "recipe.txt"))


def test_recipe_errors_are_config_errors():
    assert issubclass(RecipeError, ConfigError) and issubclass(ConfigError, ValueError)
    assert isinstance(load_config("arithmetic"), PosttrainConfig)
