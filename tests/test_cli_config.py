"""`posttrain config show`: YAML on success, one-line errors with exit code 2 otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.config import from_yaml, load_config
from posttrain.entrypoints.cli import EXIT_CONFIG_ERROR, main

SRC = Path(__file__).resolve().parent.parent / "src"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_show_prints_the_resolved_config(capsys):
    code, out, err = _run(
        capsys, "config", "show", "--config", "arithmetic", "--", "rl.max_steps=3"
    )
    assert code == 0 and err == ""
    assert from_yaml(out) == load_config("arithmetic", ["--", "rl.max_steps=3"])


def test_show_prints_warnings_to_stderr(capsys):
    data = [f"data.train_path={FIXTURES / 'gsm8k_train.jsonl'}", "data.allow_repeats=true",
            f"data.val_path={FIXTURES / 'gsm8k_val.jsonl'}"]  # fmt: skip
    code, out, err = _run(capsys, "config", "show", "--config", "gspo_qwen3b_gsm8k", "--", *data)
    assert code == 0 and from_yaml(out).job.algorithm == "gspo"
    assert err.startswith("warning: model.dtype=bfloat16") and err.count("\n") == 1


@pytest.mark.parametrize(
    ("opts", "fragment"),
    [
        (["rl.epsilon_lo=0.1"], "unknown config key 'rl.epsilon_lo': did you mean rl.epsilon_low?"),
        (["rl.objective=degenerate"], "write rl.grpo_surrogate=legacy_pg"),
        (["rl.objective_mode=direct"], "write rl.distillation_mode=direct"),
        (["rollout.max_tokens=true"], "rollout.max_tokens: Input should be a valid integer"),
        (["rollout.max_tokens=0"], "rollout.max_tokens: Input should be greater than 0"),
        (["rollout.max_tokens=2.5"], "rollout.max_tokens"),
        (["rl.epsilon_low=0.1"], "preflight: rl.epsilon_low=0.1 is never read"),
        (["rl.lr"], "not of the form section.key=value"),
    ],
)
def test_bad_overrides_exit_2_with_one_line(capsys, opts, fragment):
    code, out, err = _run(capsys, "config", "show", "--config", "arithmetic", "--", *opts)
    assert code == EXIT_CONFIG_ERROR == 2
    assert out == ""
    assert err.startswith("posttrain: error: ") and err.count("\n") == 1
    assert fragment in err and "Traceback" not in err


def test_missing_recipe_is_a_one_line_error(capsys):
    code, _, err = _run(capsys, "config", "show", "--config", "no_such_recipe")
    assert code == 2 and "neither a file nor a built-in recipe" in err and err.count("\n") == 1


def test_real_process_prints_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "posttrain.entrypoints.cli", "config", "show", "--config",
         "arithmetic", "--", "rl.objective=clipped"],
        capture_output=True, text=True, env={"PYTHONPATH": str(SRC)}, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "posttrain: error: config key 'rl.objective' is retired: write "
        "rl.grpo_surrogate=clipped instead of rl.objective=clipped\n"
    )
