"""``load_config``: recipe file (or saved YAML/JSON) plus dotlist overrides -> resolved config.

A recipe is a Python file that defines ``build_config() -> PosttrainConfig`` (the name is
:data:`RECIPE_BUILDER`). Recipes compose by importing each other's builders, e.g.
``from posttrain.configs.grpo_base import build_grpo_config``. Workers call ``load_config`` with the
same path and override list as the driver, so everything that defines a run must be in those two.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path

from posttrain.config.errors import ConfigError, RecipeError
from posttrain.config.overrides import apply_overrides, split_dashdash
from posttrain.config.schema import PosttrainConfig
from posttrain.config.serialize import from_json, from_yaml

#: The function every recipe file defines.
RECIPE_BUILDER = "build_config"

#: Where the built-in recipes live; ``--config arithmetic`` means ``BUILTIN_RECIPES/arithmetic.py``.
BUILTIN_RECIPES = Path(__file__).resolve().parent.parent / "configs"


def builtin_recipes() -> list[str]:
    """Names of the recipes shipped in ``posttrain/configs``."""
    return sorted(p.stem for p in BUILTIN_RECIPES.glob("*.py") if not p.stem.startswith("_"))


def recipe_summary(name: str) -> str:
    """The first line of built-in recipe ``name``'s docstring, read without importing it."""
    doc = ast.get_docstring(ast.parse((BUILTIN_RECIPES / f"{name}.py").read_text())) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def resolve_recipe_path(config_path: str | Path) -> Path:
    """An existing file path as given, else a built-in recipe name; raise if neither."""
    path = Path(config_path)
    if path.is_file():
        return path
    builtin = BUILTIN_RECIPES / f"{config_path}.py"
    if path.suffix == "" and builtin.is_file():
        return builtin
    raise RecipeError(
        f"config {str(config_path)!r} is neither a file nor a built-in recipe",
        builtin_recipes(),
        "built-in recipes",
    )


def build_recipe(path: Path) -> PosttrainConfig:
    """Import the recipe file at ``path`` and call its builder."""
    name = "_posttrain_recipe_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise RecipeError(f"recipe {str(path)!r} cannot be imported (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except ConfigError:
        raise
    except Exception as e:
        raise RecipeError(f"recipe {str(path)!r} failed to import: {type(e).__name__}: {e}") from e
    finally:
        sys.modules.pop(name, None)
    builder = getattr(module, RECIPE_BUILDER, None)
    if not callable(builder):
        raise RecipeError(f"recipe {str(path)!r} defines no {RECIPE_BUILDER}() function")
    try:
        config = builder()
    except ConfigError:
        raise
    except Exception as e:
        raise RecipeError(f"{path}:{RECIPE_BUILDER}() failed: {type(e).__name__}: {e}") from e
    if not isinstance(config, PosttrainConfig):
        raise RecipeError(
            f"{path}:{RECIPE_BUILDER}() returned {type(config).__name__}, not PosttrainConfig"
        )
    return config


def load_base(config_path: str | Path) -> PosttrainConfig:
    """The config a path names before overrides: a recipe, or a saved ``.yaml``/``.json``."""
    path = resolve_recipe_path(config_path)
    if path.suffix in (".yaml", ".yml"):
        return from_yaml(path.read_text())
    if path.suffix == ".json":
        return from_json(path.read_text())
    if path.suffix != ".py":
        raise RecipeError(f"config {str(path)!r}: expected a .py recipe or a .yaml/.json config")
    return build_recipe(path)


def load_config(config_path: str | Path, argv: Sequence[str] = ()) -> PosttrainConfig:
    """Resolve ``config_path`` and apply the overrides after ``--`` in ``argv``, in order."""
    return apply_overrides(load_base(config_path), split_dashdash(argv))
