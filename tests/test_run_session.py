"""The run session end to end through the CLI: what a rerun says and does with the run directory
it meets (resume line, already complete, refusals that leave the directory alone, records moved
aside, a truncated history, placement changes on resume)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from posttrain.entrypoints.cli import main
from posttrain.model.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def grpo(tmp: Path, model: Path, **extra) -> list[str]:
    opts = {
        "job.output_root": tmp / "out", "model.name_or_path": model, "data.train_size": 40,
        "data.val_size": 4, "data.prompts_per_step": 2, "rollout.n": 2, "rollout.max_tokens": 2,
        "rl.max_steps": 4, "rl.save_every": 2, "rl.eval_every": 2, "rl.micro_batch_size": 4,
        "logging.progress": False,
    }  # fmt: skip
    opts.update(extra)
    return ["grpo", "--config", "arithmetic", "--", *(f"{k}={v}" for k, v in opts.items())]


def run_dir(tmp: Path) -> Path:
    return tmp / "out" / "grpo" / "arithmetic_tiny"


def steps_in(path: Path) -> list[int]:
    return [json.loads(x)["step"] for x in path.read_text().splitlines()]


def test_rerun_resumes_or_says_complete_and_fewer_steps_are_refused(
    tmp_path, tiny_dir, capsys, caplog
):
    caplog.set_level(logging.INFO, logger="posttrain")
    assert main(grpo(tmp_path, tiny_dir, **{"rl.max_steps": 2})) == 0
    capsys.readouterr()
    assert main(grpo(tmp_path, tiny_dir)) == 0
    assert f"resuming from step 2 (checkpoint {run_dir(tmp_path)}/checkpoints/step_00000002)" in (
        caplog.text
    )
    assert "trained 2 steps" in capsys.readouterr().out
    record = (run_dir(tmp_path) / "config.yaml").read_bytes()

    assert main(grpo(tmp_path, tiny_dir)) == 0  # the same command again
    assert "already complete at step 4: nothing to train" in capsys.readouterr().out

    assert main(grpo(tmp_path, tiny_dir, **{"rl.max_steps": 2})) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err.startswith("posttrain: error: ResumeError: rl.max_steps=2 is below step 4")
        and "\n" not in err
    )
    assert "trained -" not in err
    assert main(grpo(tmp_path, tiny_dir, **{"rl.lr": 0.5})) == 1
    assert "resolved config differs in ['rl.lr']" in capsys.readouterr().err
    assert (run_dir(tmp_path) / "config.yaml").read_bytes() == record  # refusals left it alone
    assert steps_in(run_dir(tmp_path) / "metrics.jsonl") == [0, 1, 2, 3, 4]


def test_a_rerun_after_checkpoints_vanished_keeps_the_old_history(tmp_path, tiny_dir, caplog):
    assert main(grpo(tmp_path, tiny_dir)) == 0
    shutil.rmtree(run_dir(tmp_path) / "checkpoints")
    assert main(grpo(tmp_path, tiny_dir, **{"rl.max_steps": 2})) == 0
    aside = run_dir(tmp_path) / ".previous-1"
    assert steps_in(aside / "metrics.jsonl") == [0, 1, 2, 3, 4]
    assert steps_in(run_dir(tmp_path) / "metrics.jsonl") == [0, 1, 2]
    assert sorted(p.name for p in (aside / "samples").iterdir()) == [
        "step_000000.jsonl", "step_000002.jsonl", "step_000004.jsonl", "train",
    ]  # fmt: skip
    assert sorted(p.name for p in (run_dir(tmp_path) / "samples").iterdir()) == [
        "step_000000.jsonl", "step_000002.jsonl", "train",
    ]  # fmt: skip
    assert "starting from step 0, the old records" in caplog.text


def test_a_truncated_history_is_reported_on_resume(tmp_path, tiny_dir):
    assert main(grpo(tmp_path, tiny_dir)) == 0
    metrics = run_dir(tmp_path) / "metrics.jsonl"
    metrics.write_text("".join(metrics.read_text().splitlines(keepends=True)[:2]))  # steps 0, 1
    with pytest.warns(UserWarning, match="metrics.jsonl lacks steps 2-4 of the 4 steps the"):
        assert main(grpo(tmp_path, tiny_dir, **{"rl.max_steps": 6})) == 0
    assert steps_in(metrics) == [0, 1, 5, 6]


def test_resume_may_change_where_it_runs(tmp_path, tiny_dir, capsys):
    assert main(grpo(tmp_path, tiny_dir, **{"rl.max_steps": 2})) == 0
    capsys.readouterr()
    moved = {"rl.max_steps": 4, "placement.torch_threads_per_process": 1,
             "placement.device": "cpu"}  # fmt: skip
    with pytest.warns(UserWarning, match="placement.device changed from auto to cpu: another"):
        assert main(grpo(tmp_path, tiny_dir, **moved)) == 0, capsys.readouterr().err
    assert steps_in(run_dir(tmp_path) / "metrics.jsonl") == [0, 1, 2, 3, 4]


def test_a_run_logs_its_first_step_and_announces_the_evaluations_before_and_after(
    tmp_path, tiny_dir, caplog
):
    """A user with 3-minute steps and logging.log_every=10 saw nothing for 7 minutes: the first
    step is logged, and the evaluations before and after training say they are running."""
    caplog.set_level(logging.INFO, logger="posttrain")
    assert main(grpo(tmp_path, tiny_dir, **{"logging.log_every": 10})) == 0
    lines = [m for m in caplog.messages if "evaluating" in m or " step " in m]
    assert lines == [
        "evaluating on 4 held-out problems (greedy) before training...",
        lines[1],
        "evaluating on 4 held-out problems (greedy) after training...",
        lines[3],
    ]
    assert lines[1].startswith("arithmetic_tiny step 1/4 ")
    assert lines[3].startswith("arithmetic_tiny step 4/4 ")
