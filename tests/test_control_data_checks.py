"""The data stage of preflight: files exist, JSONL rows parse, a step fits the distinct prompts;
`config show` reports each in one line, before any model is built."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.config import ConfigError, load_config
from posttrain.control.data_checks import check_data, load_tasks
from posttrain.entrypoints.cli import main

FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: arithmetic's recipe knobs reset, as the data.task=jsonl switch needs (config guide)
JSONL = ["data.task=jsonl", "data.digits=@default", "data.train_size=@default",
         "data.val_size=@default", "data.prompts_per_step=4"]  # fmt: skip


def show(capsys, *opts: str) -> tuple[int, str]:
    code = main(["config", "show", "--config", "arithmetic", "--", *opts])
    err = capsys.readouterr().err
    assert err.count("\n") <= 1 and "Traceback" not in err
    return code, err.strip()


def test_config_show_refuses_a_missing_data_file_naming_its_key(capsys, tmp_path):
    val = FIXTURES / "gsm8k_val.jsonl"
    code, err = show(capsys, *JSONL, f"data.train_path={tmp_path / 'nope.jsonl'}",
                     f"data.val_path={val}")  # fmt: skip
    assert code == 2
    assert err.startswith(
        f"posttrain: error: data.train_path='{tmp_path / 'nope.jsonl'}': no such file"
    )
    assert "docs/guides/config.md#your-own-data-a-jsonl-task" in err and "val_path" not in err
    code, err = show(capsys, *JSONL, f"data.train_path={tmp_path}", f"data.val_path={val}")
    assert code == 2 and "a directory, not a file" in err


def test_config_show_refuses_a_row_without_its_answer_line(capsys, tmp_path):
    rows = tmp_path / "train.jsonl"
    good = '{"question": "What is 2+2?", "answer": "2+2=4\\n#### 4"}\n'
    rows.write_text(good * 3 + '{"question": "What is 3+3?", "answer": "six"}\n')
    code, err = show(capsys, *JSONL, f"data.train_path={rows}", "rl.eval_every=0")
    assert code == 1
    assert (
        err
        == f"posttrain: error: TaskDataError: {rows}:4: field 'answer' has no final '#### N' line"
    )


def test_config_show_refuses_a_missing_pairs_manifest(capsys, tmp_path):
    code = main(
        ["config", "show", "--config", "dpo_shapes", "--", f"dpo.pairs_path={tmp_path / 'p.jsonl'}"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "dpo.pairs_path=" in err and "posttrain dpo make-pairs" in err


def test_more_prompts_per_step_than_distinct_prompts_needs_consent(capsys):
    code, err = show(capsys, "data.prompts_per_step=1000")
    assert code == 2
    assert err == (
        "posttrain: error: data.prompts_per_step=1000 exceeds the 80 distinct train prompts of "
        "data.task=arithmetic, so each step would repeat prompts (~12.5x each); lower "
        "data.prompts_per_step to at most 80, or set data.allow_repeats=true to repeat them"
    )
    assert show(capsys, "data.prompts_per_step=80") == (0, "")
    assert show(capsys, "data.prompts_per_step=1000", "data.allow_repeats=true") == (0, "")


def test_a_file_that_repeats_questions_counts_them_once(tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"question": "1+1=", "answer": "#### 2"}\n' * 5)
    config = load_config("arithmetic", ["--", *JSONL, f"data.train_path={rows}", "rl.eval_every=0",
                                        "data.prompts_per_step=2"])  # fmt: skip
    with pytest.raises(ConfigError, match="exceeds the 1 distinct train prompts"):
        load_tasks(config)  # what the run itself checks, before any model loads
    with pytest.raises(ConfigError, match="exceeds the 1 distinct"):
        check_data(config)


def test_reasoning_gym_is_counted_not_generated(monkeypatch):
    import posttrain.data.tasks.reasoning_gym as rg

    monkeypatch.setattr(rg, "make_reasoning_gym_source", None)  # generating would fail
    monkeypatch.setattr(rg, "import_reasoning_gym", lambda: object())
    config = load_config("smollm2_reasoning_gym", ["--", "data.prompts_per_step=2001"])
    with pytest.raises(ConfigError, match="exceeds the 2000 distinct train prompts"):
        check_data(config)
    check_data(load_config("smollm2_reasoning_gym"))


def test_held_out_set_covers_the_policy_ranks_only_when_the_run_evaluates():
    from posttrain.config import PosttrainConfig
    from posttrain.config.overrides import apply_overrides
    from posttrain.control.data_checks import held_out_covers_ranks

    ranks = ["placement.backend=ray", "placement.policy_ranks=3"]
    cfg = apply_overrides(PosttrainConfig(), [*ranks, "rl.eval_every=5"])
    held_out_covers_ranks(cfg, 3, "val.jsonl", "pair")  # one each
    with pytest.raises(ConfigError, match=r"^val.jsonl has 2 held-out pairs, fewer than "
                       r"placement.policy_ranks=3; add pairs, lower policy_ranks or set "
                       r"rl.eval_every=0$"):  # fmt: skip
        held_out_covers_ranks(cfg, 2, "val.jsonl", "pair")
    cfg = apply_overrides(PosttrainConfig(), [*ranks, "rl.eval_every=0"])
    held_out_covers_ranks(cfg, 1, "val.jsonl", "row")  # never scored
