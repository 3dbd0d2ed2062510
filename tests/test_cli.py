"""The `posttrain` parser: usage errors, per-entry help and recipes, --version, --debug anywhere,
whole choice lists in one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.config import load_config
from posttrain.entrypoints.cli import EXIT_CONFIG_ERROR, build_parser, main, split_argv

SRC = Path(__file__).resolve().parent.parent / "src"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [[], ["config"], ["config", "show"], ["bogus"]])
def test_usage_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "usage: posttrain" in capsys.readouterr().err


def test_split_argv_takes_everything_after_the_first_dashdash():
    assert split_argv(["a", "--", "x=1", "--", "y=2"]) == (["a"], ["x=1", "--", "y=2"])
    assert split_argv(["a"]) == (["a"], [])


def test_parser_has_the_config_command():
    args = build_parser().parse_args(["config", "show", "--config", "r.py"])
    assert args.config == "r.py" and callable(args.handler)


@pytest.mark.parametrize(
    ("entry", "listed", "absent"),
    [
        ("grpo", {"arithmetic_clipped", "grpo_base", "smollm2_reasoning_gym", "smollm2_calculator"},
         {"dpo_shapes", "opd_arithmetic"}),
        ("opd", {"opd_arithmetic"}, {"dpo_shapes", "arithmetic_clipped"}),
        ("dpo", {"dpo_shapes"}, {"opd_arithmetic", "arithmetic_clipped"}),
    ],
)  # fmt: skip
def test_entry_help_lists_only_the_recipes_it_trains(capsys, entry, listed, absent):
    with pytest.raises(SystemExit) as info:
        main([entry, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    recipes = out.split(f"built-in {entry} recipes", 1)[1].split("\n\n", 1)[0]
    names = {line.split()[0] for line in recipes.splitlines()[1:]}
    assert listed <= names and not names & absent, names


@pytest.mark.parametrize(
    ("entry", "recipe", "fragment"),
    [
        ("grpo", "dpo_shapes", "job.algorithm=dpo is Diffusion DPO (offline, on preference pairs), "
         "which `posttrain grpo` does not train; run `posttrain dpo --config ...`"),
        ("opd", "dpo_shapes", "which `posttrain opd` does not train; run `posttrain dpo"),
        ("dpo", "arithmetic_clipped", "job.algorithm=grpo is a GRPO-family algorithm (online RL), "
         "which `posttrain dpo` does not train; run `posttrain grpo --config ...`"),
        ("dpo", "opd_arithmetic", "which `posttrain dpo` does not train; run `posttrain opd"),
        ("grpo", "opd_arithmetic", "run `posttrain opd --config ...`"),
    ],
)  # fmt: skip
def test_an_entry_refuses_another_entrys_recipe_naming_the_command(capsys, entry, recipe, fragment):
    code, out, err = _run(capsys, entry, "--config", recipe)
    assert code == EXIT_CONFIG_ERROR and out == ""
    assert err.startswith("posttrain: error: preflight: ") and err.count("\n") == 1
    assert fragment in err, err


def test_version_is_the_packages(capsys):
    import tomllib

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    pyproject = tomllib.loads((SRC.parent / "pyproject.toml").read_text())
    assert capsys.readouterr().out == f"posttrain {pyproject['project']['version']}\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["--debug", "config", "show", "--config", "no_such_recipe"],
        ["config", "show", "--debug", "--config", "no_such_recipe"],
        ["grpo", "--debug", "--config", "no_such_recipe"],
        ["dpo", "--config", "no_such_recipe", "--debug"],
    ],
)
def test_debug_is_accepted_before_or_after_the_subcommand(capsys, argv):
    code, _, err = _run(capsys, *argv)
    assert code == 2 and "Traceback" in err and "RecipeError" in err
    code, _, err = _run(capsys, *[a for a in argv if a != "--debug"])
    assert code == 2 and "Traceback" not in err


def test_a_long_list_of_choices_survives_the_message_cap(capsys, tmp_path):
    from posttrain.run.guard import MAX_MESSAGE

    keys = {f"train/objective_{i:03d}/metric_name": float(i) for i in range(60)}
    rows = [json.dumps({"step": s, **keys}) for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    code, _, err = _run(capsys, "plot", str(tmp_path), "--metrics", "val/nope")
    line = err.strip()
    assert code == 1 and err.count("\n") == 1 and len(line) > 2 * MAX_MESSAGE
    assert line.endswith("keys: " + ", ".join(sorted(keys)))  # every key, none cut


def test_the_recipe_list_of_a_missing_recipe_is_whole():
    from posttrain.config import RecipeError, builtin_recipes
    from posttrain.run.guard import one_line

    with pytest.raises(RecipeError) as info:
        load_config("no_such_recipe")
    assert info.value.choices == "built-in recipes: " + ", ".join(builtin_recipes())
    cut = one_line("x" * 5000 + "; " + info.value.choices, limit=100, keep=info.value.choices)
    assert cut.endswith(info.value.choices) and "characters cut" in cut
    assert len(cut) < 140 + len(info.value.choices)  # the limit, the marker, the whole list


@pytest.mark.parametrize(("entry", "recipe"), [("grpo", "arithmetic_clipped"),
                                              ("sft", "sft_tools_tiny")])  # fmt: skip
def test_help_lists_recipes_without_loading_torch(entry, recipe):
    code = (
        "import sys\n"
        "from posttrain.entrypoints.cli import main\n"
        f"try:\n    main(['{entry}', '--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(SRC)}, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert recipe in proc.stdout
