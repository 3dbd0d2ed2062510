"""Preflight rules that read beyond the config: reward modules from the working directory, the
tokenizer's chat template; and the reset syntax that clears a recipe's task knobs."""

from __future__ import annotations

import itertools
import sys
import textwrap
from pathlib import Path

import pytest

from posttrain.config import apply_overrides, load_config
from posttrain.control import PreflightError, run_preflight
from posttrain.control.external import chat_template_in
from posttrain.entrypoints.cli import EXIT_CONFIG_ERROR, main
from posttrain.model.tokenizer import build_char_tokenizer, save_char_tokenizer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
JSONL = [
    "data.task=jsonl",
    f"data.train_path={FIXTURES / 'gsm8k_train.jsonl'}",
    f"data.val_path={FIXTURES / 'gsm8k_val.jsonl'}",
]

_IDS = itertools.count()
REWARDS = textwrap.dedent(
    """
    def bonus(prompt, completion, answer, meta):
        return 0.5

    def two_args(prompt, completion):
        return 0.0

    THRESHOLD = 3
    """
)


def _show(capsys, *opts: str) -> tuple[int, str, str]:
    code = main(["config", "show", "--config", "arithmetic", "--", *opts])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cwd_module(tmp_path, monkeypatch):
    """A reward module in a fresh working directory that is not on sys.path."""
    name = f"cwd_rewards_{next(_IDS)}"  # a fresh module name: no earlier import is cached
    (tmp_path / f"{name}.py").write_text(REWARDS)
    (tmp_path / "broken_rewards.py").write_text("def bonus(prompt:\n")
    monkeypatch.chdir(tmp_path)
    yield name
    sys.modules.pop(name, None)
    sys.modules.pop("broken_rewards", None)


def test_reward_module_in_the_working_directory_loads(capsys, cwd_module):
    path_before = list(sys.path)
    code, out, err = _show(capsys, f"reward.functions=[{cwd_module}:bonus]")
    assert code == 0 and err == "", err
    assert f"{cwd_module}:bonus" in out
    assert sys.path == path_before  # the directory is searched for the import only


@pytest.mark.parametrize(
    ("attr", "fragment"),
    [
        ("missing", "has no attribute 'missing'; define fn(prompt, completion, answer, meta)"),
        ("THRESHOLD", "'THRESHOLD' is a int, not a function; name a fn(prompt, completion"),
        ("two_args", "cannot be called as fn(prompt, completion, answer, meta) -> float (too many"),
    ],
)
def test_bad_reward_function_is_one_line_from_config_show(capsys, cwd_module, attr, fragment):
    code, out, err = _show(capsys, f"reward.functions=[{cwd_module}:{attr}]")
    assert code == EXIT_CONFIG_ERROR and out == ""
    assert err.startswith(f"posttrain: error: preflight: reward.functions entry '{cwd_module}:")
    assert fragment in err and err.count("\n") == 1


def test_unimportable_reward_module_says_where_it_looked(capsys, cwd_module):
    code, _, err = _show(capsys, "reward.functions=[not_here_rewards:bonus]")
    assert code == EXIT_CONFIG_ERROR and err.count("\n") == 1
    assert "cannot import module 'not_here_rewards'" in err
    assert "run from the directory that holds it or add that directory to PYTHONPATH" in err


def test_reward_module_that_fails_to_import_names_file_and_line(capsys, cwd_module):
    code, _, err = _show(capsys, "reward.functions=[broken_rewards:bonus]")
    assert code == EXIT_CONFIG_ERROR and err.count("\n") == 1
    assert "importing module 'broken_rewards' failed: SyntaxError" in err
    assert "broken_rewards.py, line 1" in err


def test_reward_function_listed_twice(cwd_module):
    spec = f"{cwd_module}:bonus"
    with pytest.raises(PreflightError, match=f"reward.functions lists '{spec}' twice"):
        run_preflight(load_config("arithmetic", ["--", f"reward.functions=[{spec}, {spec}]"]))


def _tokenizer_dir(tmp_path: Path, template: str | None) -> Path:
    tok = build_char_tokenizer()
    if template is not None:
        tok.chat_template = template
    save_char_tokenizer(tok, tmp_path / "tok")
    return tmp_path / "tok"


def test_chat_template_read_from_saved_tokenizer_files(tmp_path):
    without = _tokenizer_dir(tmp_path / "a", None)
    with_template = _tokenizer_dir(
        tmp_path / "b", "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    assert chat_template_in(without) is False
    assert chat_template_in(with_template) is True
    assert chat_template_in(tmp_path / "nothing_here") is None
    opts = ["data.prompt_template=chat", f"model.tokenizer_path={without}"]
    with pytest.raises(PreflightError) as info:
        run_preflight(load_config("arithmetic", ["--", *opts]))
    assert f"model.tokenizer_path='{without}' has none" in str(info.value)
    assert "use data.prompt_template=plain" in str(info.value)
    opts[1] = f"model.tokenizer_path={with_template}"
    assert run_preflight(load_config("arithmetic", ["--", *opts])) == []


@pytest.mark.parametrize(("preset", "refused"), [("arith", True), ("arith_tools", False)])
def test_a_preset_to_build_has_a_chat_template_only_with_the_tools(tmp_path, preset, refused):
    """The folder is not built yet: a tools preset's tokenizer carries the tools template."""
    opts = ["data.prompt_template=chat", "data.system_prompt=null",
            f"model.name_or_path={tmp_path / 'm'}", f"model.init_preset={preset}"]  # fmt: skip
    if refused:
        with pytest.raises(PreflightError, match=f"model.init_preset={preset} builds a char"):
            run_preflight(load_config("arithmetic", ["--", *opts]))
    else:
        assert run_preflight(load_config("arithmetic", ["--", *opts])) == []


def test_chat_template_in_a_jinja_file_counts(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert chat_template_in(tmp_path) is False
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    assert chat_template_in(tmp_path) is True


def test_arithmetic_recipe_to_jsonl_names_the_keys_and_their_reset(capsys):
    with pytest.raises(PreflightError) as info:
        run_preflight(load_config("arithmetic", ["--", *JSONL]))
    text = str(info.value)
    assert (
        "data.digits=1 is never read by data.task=jsonl; reset with data.digits=@default (-> 2)"
        in text
    )
    assert (
        "data.train_size=80, data.val_size=20 are never read by data.task=jsonl (it reads whole "
        "files); reset with data.train_size=@default (-> 1000), data.val_size=@default (-> 64)"
    ) in text
    resets = ["data.digits=@default", "data.train_size=@default", "data.val_size=@default"]
    config = load_config("arithmetic", ["--", *JSONL, *resets])
    assert run_preflight(config) == []
    code, out, err = _show(capsys, *JSONL, *resets, "data.prompts_per_step=4")  # 6 train rows
    assert code == 0 and err == "" and "task: jsonl" in out


def test_reset_matches_a_fresh_default():
    cfg = load_config("arithmetic", ["--", "data.digits=@default"])
    assert (
        cfg.data.digits == apply_overrides(load_config("arithmetic"), ["data.digits=2"]).data.digits
    )
