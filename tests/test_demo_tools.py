"""`make demo-tools`: its recipes run (a few steps), its model preset, shaping and summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.env.render import check_template
from posttrain.model.loading import load_tokenizer
from posttrain.model.tiny import build_tiny_model
from posttrain.reward.shaping import digit_match
from posttrain.run.records import FINAL_DIR

REPO = Path(__file__).resolve().parents[1]


def test_digit_match_by_position() -> None:
    assert digit_match("", "579", "579", {}) == 0.0  # exact: the verifier pays
    assert digit_match("", " 579", "579", {}) == 0.0  # the right-aligned copy is exact too
    assert digit_match("", "578", "579", {}) == pytest.approx(0.1 + 0.2 * 2 / 3)
    assert digit_match("", "5790", "579", {}) == pytest.approx(0.1 + 0.2 * 3 / 4)
    assert digit_match("", "1", "1024", {}) == pytest.approx(0.1 + 0.2 / 4)
    assert digit_match("", "abc", "579", {}) == 0.0
    assert digit_match("", "<tool_call>1+2</tool_call>", "3", {}) == 0.0


def test_arith_tools_preset_has_markers_and_a_prefix_stable_template(tmp_path) -> None:
    tok = load_tokenizer(build_tiny_model("arith_tools", tmp_path / "m"))
    text = tok.apply_chat_template([{"role": "user", "content": "123+456="}], tokenize=False,
                                   add_generation_prompt=True)  # fmt: skip
    assert text == "<bos>U:123+456=<eos>\nA:"
    ids = tok("<tool_call>123+456</tool_call>", add_special_tokens=False).input_ids
    assert len(ids) == 9 and tok.unk_token_id not in ids  # one id per marker
    check_template(tok, [])


def _train(tmp: Path, recipe: str, model: Path, extra: dict | None = None) -> Path:
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.entrypoints import grpo

    opts = {
        "job.output_root": str(tmp / "out"), "model.name_or_path": str(model),
        "data.train_size": 32, "data.val_size": 4, "data.prompts_per_step": 2, "rollout.n": 4,
        "rl.max_steps": 2, "rl.save_every": 2, "rl.eval_every": 2, "rl.micro_batch_size": 8,
        "logging.progress": False, **(extra or {}),
    }  # fmt: skip
    opts = [f"{k}={v}" for k, v in opts.items()]
    config = load_config(recipe, ["--", *opts])
    summary = grpo.run(config, recipe, opts, grpo.default_out_dir(config), build_objective)
    return Path(summary["run_dir"])


def test_stage2_continues_from_stage1_s_final_model() -> None:
    from posttrain.config import load_config
    from posttrain.configs.tools_addition import STAGE1_STEPS, STAGE2_STEPS

    for stage1 in ("tools_addition", "tools_addition_notool"):
        first, second = load_config(stage1), load_config(f"{stage1}_stage2")
        assert second.model.name_or_path == f"outputs/grpo/{stage1}/final_model"
        assert (second.model.init_preset, second.job.name) == (None, f"{stage1}_stage2")
        assert (first.rl.max_steps, second.rl.max_steps) == (STAGE1_STEPS, STAGE2_STEPS)
        # nothing else differs: the environment, rewards and optimiser are stage 1's
        assert second.env == first.env and second.reward == first.reward
        assert second.rl.model_copy(update={"max_steps": 0, "save_every": 0}) == (
            first.rl.model_copy(update={"max_steps": 0, "save_every": 0})
        )


def test_the_demo_recipes_train_and_summarise(tmp_path) -> None:
    from posttrain.configs.tools_addition_reset import DEMO_STEPS, RESET_EVERY

    sides, reset = {}, {"rl.max_steps": 4, "rl.reference_reset_every": 2}
    for recipe in ("tools_addition_reset", "tools_addition_notool_reset"):
        sides[recipe] = _train(tmp_path, recipe, tmp_path / "model", reset)
    tools, plain = sides["tools_addition_reset"], sides["tools_addition_notool_reset"]
    rows = [json.loads(r) for r in (tools / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 4 and all("train/reward_env_mean" in r for r in steps)
    assert [r["train/reference/resets"] for r in steps] == [0, 1, 1, 2]
    assert "val/env/tool_calls_mean" in rows[-1]
    plain_rows = [json.loads(r) for r in (plain / "metrics.jsonl").read_text().splitlines()]
    assert not any("train/reward_env_mean" in r for r in plain_rows)  # no environment
    joined = tmp_path / "joined"
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "tools_demo_summary.py"), "--with", str(tools),
         "--without", str(plain), "--joined", str(joined)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = out.stdout.splitlines()
    assert lines[1].startswith("with the calculator") and lines[2].startswith("without it")
    assert lines[1].split()[3] == "4"
    assert lines[-1].startswith("target (>= 0.9 with the tool, <= 0.3 without): ")
    for side in ("with_calculator", "without"):
        records = [
            json.loads(r) for r in (joined / side / "metrics.jsonl").read_text().splitlines()
        ]
        assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3, 4]
        assert [r["step"] for r in records if "val/accuracy" in r] == [0, 2, 4]
    from posttrain.config import load_config

    demo, plain_demo = (
        load_config("tools_addition_reset"),
        load_config("tools_addition_notool_reset"),
    )
    assert (demo.rl.max_steps, demo.rl.reference_reset_every) == (DEMO_STEPS, RESET_EVERY)
    assert demo.rl.credit == "state" and plain_demo.rl.credit == "trajectory"
    # the two sides differ only in the environment (and the credit a single turn cannot use)
    assert plain_demo.rl.model_copy(update={"credit": "state"}) == demo.rl


def test_a_stage_chain_is_joined_into_one_run(tmp_path) -> None:
    first = _train(tmp_path, "tools_addition_notool", tmp_path / "model")
    second = _train(tmp_path, "tools_addition_notool_stage2", first / FINAL_DIR)
    joined = tmp_path / "joined"
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "tools_demo_summary.py"), "--with", str(first),
         str(second), "--without", str(first), "--joined", str(joined)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    records = [
        json.loads(r)
        for r in (joined / "with_calculator" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records if "train/loss" in r] == [1, 2, 3, 4]
    assert [r["step"] for r in records if "val/accuracy" in r] == [0, 2, 4]


def test_exact_digits_draws_operands_of_that_many_digits() -> None:
    from posttrain.data.tasks.arithmetic import arithmetic_space, make_arithmetic_source

    src = make_arithmetic_source(seed=0, digits=3, operators="+", train_size=200, val_size=50,
                                 exact_digits=True)  # fmt: skip
    items = [*src._train, *src.val_items()]
    assert all(100 <= it.meta["a"] <= 999 and 100 <= it.meta["b"] <= 999 for it in items)
    assert not {it.prompt for it in src.val_items()} & {it.prompt for it in src._train}
    assert arithmetic_space(3, "+", exact_digits=True) == 900**2
    assert arithmetic_space(1, "+", exact_digits=True) == 100  # one digit: 0..9 either way


def test_the_summary_names_a_stage_not_trained_yet(tmp_path) -> None:
    missing = tmp_path / "tools_addition_stage2"
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "tools_demo_summary.py"), "--with", str(missing),
         "--without", str(missing)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode != 0
    assert out.stderr.strip() == (
        f"{missing}: no steps or no evaluation after training in metrics.jsonl; train it first"
    )
