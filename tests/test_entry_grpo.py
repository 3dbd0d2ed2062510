"""The GRPO entry end to end on tiny models: wiring, determinism, resume, builder rules, errors."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_here import posttrain_here

from posttrain.config import ConfigError, load_config
from posttrain.config.build import build_objective
from posttrain.config.user_code import BuilderError, check_builder
from posttrain.entrypoints import grpo
from posttrain.model.tiny import build_tiny_model

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def quick_opts(tmp: Path, model: Path, **extra) -> list[str]:
    opts = {
        "job.output_root": str(tmp / "out"),
        "model.name_or_path": str(model),
        "data.train_size": 60,
        "data.val_size": 8,
        "data.prompts_per_step": 4,
        "rollout.n": 4,
        "rollout.max_tokens": 3,
        "rl.max_steps": 4,
        "rl.save_every": 2,
        "rl.eval_every": 2,
        "rl.micro_batch_size": 8,
        "logging.progress": False,
    }
    opts.update(extra)
    return [f"{k}={v}" for k, v in opts.items()]


def train(opts: list[str], recipe: str = "arithmetic", builder=build_objective) -> dict:
    config = load_config(recipe, ["--", *opts])
    return grpo.run(config, recipe, opts, grpo.default_out_dir(config), builder)


def metrics_of(summary: dict) -> list[dict]:
    return [
        json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]


def _strip_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/")) and "per_s" not in k
             and "time_s" not in k} for r in rows]  # fmt: skip


def test_run_writes_metrics_samples_config_and_checkpoints(tmp_path, tiny_dir):
    summary = train(quick_opts(tmp_path, tiny_dir))
    run_dir = Path(summary["run_dir"])
    assert run_dir == tmp_path / "out" / "grpo" / "arithmetic_tiny"
    rows = metrics_of(summary)
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert {"train/reward_mean", "train/loss", "time/rollout_s", "time/train_s"} <= rows[1].keys()
    assert "val/accuracy" in rows[0] and "val/accuracy" in rows[2]
    assert (run_dir / "config.yaml").exists()
    assert sorted(p.name for p in (run_dir / "samples").iterdir()) == [
        "step_000000.jsonl", "step_000002.jsonl", "step_000004.jsonl", "train",
    ]  # fmt: skip
    train_files = sorted(p.name for p in (run_dir / "samples" / "train").iterdir())
    assert train_files == [f"step_{s:06d}.jsonl" for s in range(1, 5)]
    kept = [json.loads(x) for x in (run_dir / "samples" / "train" / "step_000001.jsonl").open()]
    assert len(kept) == 4 and {"prompt", "completion", "reward", "advantage"} <= kept[0].keys()
    assert all("train/step" not in r for r in rows)  # `step` is the one step number
    sample = json.loads((run_dir / "samples" / "step_000004.jsonl").read_text().splitlines()[0])
    assert {"prompt", "completion", "reward"} <= sample.keys()
    assert (run_dir / "checkpoints" / "step_00000004").is_dir()


def half_plus_digits(prompt: str, completion: str, answer: str, meta: dict) -> float:
    """A shaping reward that is never 0 and varies with the completion."""
    return 0.5 + 0.5 * sum(c.isdigit() for c in completion)


#: A reward function faded out over three steps: weights 1, 2/3, 1/3, 0 at steps 1-4.
ANNEALED = {"reward.functions": "[test_entry_grpo:half_plus_digits]",
            "reward.functions_anneal_steps": 3}  # fmt: skip


def test_same_seed_same_metrics_and_resume_continues_exactly(tmp_path, tiny_dir):
    straight = _strip_timing(metrics_of(train(quick_opts(tmp_path / "a", tiny_dir, **ANNEALED))))
    again = _strip_timing(metrics_of(train(quick_opts(tmp_path / "b", tiny_dir, **ANNEALED))))
    assert straight == again
    # Stop after step 2 (its checkpoint), then resume=auto runs steps 3-4 from the checkpoint.
    train(quick_opts(tmp_path / "c", tiny_dir, **ANNEALED, **{"rl.max_steps": 2}))
    resumed = train(quick_opts(tmp_path / "c", tiny_dir, **ANNEALED))
    assert resumed["start_step"] == 2
    assert _strip_timing(metrics_of(resumed)) == straight


def test_annealed_reward_functions_fade_out_in_training_and_evaluation(tmp_path, tiny_dir):
    rows = metrics_of(train(quick_opts(tmp_path, tiny_dir, **ANNEALED)))
    fn = "train/reward_fn/test_entry_grpo:half_plus_digits_mean"
    weights = [r["train/reward_functions_weight"] for r in rows[1:]]
    assert weights == pytest.approx([1, 2 / 3, 1 / 3, 0], abs=1e-15)
    for r, w in zip(rows[1:], weights, strict=True):
        assert r[fn] >= 0.5  # the function's own values, unweighted
        assert r["train/reward_mean"] == pytest.approx(r["train/reward_verifier_mean"] + w * r[fn])
    # Evaluation scores with the weight of its step: full at step 0, none at step 4.
    assert rows[0]["val/reward_mean"] >= rows[0]["val/accuracy"] + 0.5
    assert rows[4]["val/reward_mean"] == pytest.approx(rows[4]["val/accuracy"])


def test_clipped_recipe_with_several_mini_batches(tmp_path, tiny_dir):
    opts = quick_opts(
        tmp_path, tiny_dir,
        **{"rl.grpo_surrogate": "clipped", "rl.mini_batch_per_replica": 2, "rl.max_steps": 2,
           "rl.loss_type": "seq-mean-token-sum-fixed", "rl.advantage_estimator": "dr_grpo"},
    )  # fmt: skip
    rows = metrics_of(train(opts))
    assert rows[1]["train/pg/ratio_mean"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("recipe", ["dr_grpo_qwen3b_gsm8k", "gspo_qwen3b_gsm8k"])
def test_qwen_recipes_run_one_step_with_stand_ins(tmp_path, tiny_dir, recipe):
    opts = [
        f"job.output_root={tmp_path}",
        f"model.name_or_path={tiny_dir}",
        f"data.train_path={FIXTURES / 'gsm8k_train.jsonl'}",
        f"data.val_path={FIXTURES / 'gsm8k_val.jsonl'}",
        "data.prompt_template=plain",
        "data.prompts_per_step=2",
        "rollout.n=2",
        "rollout.max_tokens=4",
        "rl.max_steps=1",
        "rl.save_every=0",
        "rl.resume=off",
        "rl.micro_batch_size=2",
        "logging.progress=false",
    ]
    if recipe.startswith("gspo"):
        opts += ["rl.mini_batch_per_replica=2", "model.certified_deterministic_forward=false"]
    summary = train(opts, recipe)
    rows = metrics_of(summary)
    assert rows[-1]["step"] == 1 and "train/loss" in rows[-1]


def nested_builder_factory():
    def nested(rl, ctx):
        return build_objective(rl, ctx)

    return nested


def test_builder_must_be_module_level():
    check_builder(build_objective)
    check_builder(functools.partial(build_objective))
    for bad in (nested_builder_factory(), lambda rl, ctx: None, functools.partial(lambda r, c: 0)):
        with pytest.raises(BuilderError, match="module scope"):
            check_builder(bad)
    with pytest.raises(BuilderError, match="module-level function"):
        check_builder(len)


def test_driver_edits_that_workers_cannot_see_are_refused(tmp_path, tiny_dir):
    opts = quick_opts(tmp_path, tiny_dir)
    config = load_config("arithmetic", ["--", *opts])
    config.rl.lr = 0.5
    with pytest.raises(ConfigError, match="rl.lr"):
        grpo.run(config, "arithmetic", opts, tmp_path / "x", build_objective)


def raising_reward(prompt, completion, answer, meta):
    raise RuntimeError("boom")


def _cli(args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "posttrain.entrypoints.grpo", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": f"{REPO / 'src'}:{REPO / 'tests'}", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_cli_user_errors_are_one_line(tmp_path, tiny_dir, capsys):
    base = ["--config", "arithmetic", "--", *quick_opts(tmp_path, tiny_dir)]
    bad_key = _cli([*base, "rl.epsilon_lo=0.1"], tmp_path)
    assert bad_key.returncode == 2
    assert (
        bad_key.stderr.strip().count("\n") == 0 and "did you mean rl.epsilon_low" in bad_key.stderr
    )
    raising = _cli([*base, "reward.functions=[test_entry_grpo:raising_reward]"], tmp_path)
    assert raising.returncode == 1, raising.stderr
    last = raising.stderr.strip().splitlines()[-1]
    assert "Traceback" not in raising.stderr
    assert "raising_reward" in last and "sample" in last
    from posttrain.entrypoints.cli import main

    # The same entry in this process (the two above are real processes).
    code = main(
        ["grpo", *base, f"model.name_or_path={tmp_path / 'nope'}", "model.init_preset=null"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "model.init_preset" in err and "\n" not in err, err


def test_custom_objective_from_the_command_line(tmp_path, tiny_dir):
    """The guide's example, copied beside the user's run, trains through --objective."""
    (tmp_path / "custom_objective.py").write_text(
        (REPO / "examples/custom_objective.py").read_text()
    )
    opts = ["--", *quick_opts(tmp_path, tiny_dir), "rl.max_steps=2", "rl.eval_every=0"]
    out = posttrain_here(["grpo", "--objective", "custom_objective:build", "--config",
                          "arithmetic", *opts], tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    run_dir = tmp_path / "out" / "grpo" / "arithmetic_tiny"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").open()]
    assert all("train/custom/logprob_bonus" in r for r in rows if r["step"] > 0)
    bad = posttrain_here(["grpo", "--objective", "custom_objective:nope", "--config",
                          "arithmetic", *opts], tmp_path)  # fmt: skip
    assert bad.returncode == 2 and "has no attribute 'nope'" in bad.stderr
    assert bad.stderr.strip().count("\n") == 0


def test_malformed_data_row_names_file_and_line(tmp_path, tiny_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "x"}\n')
    opts = [
        *quick_opts(tmp_path, tiny_dir),
        "data.task=jsonl", "data.digits=2", f"data.train_path={bad}", "data.val_path=null",
        "data.train_size=1000", "data.val_size=64",
        "rl.eval_every=0",
    ]  # fmt: skip
    out = posttrain_here(["grpo", "--config", "arithmetic", "--", *opts], tmp_path)
    assert out.returncode != 0
    assert f"{bad}:2" in out.stderr and "Traceback" not in out.stderr


def test_a_local_run_works_in_the_configured_torch_threads(tmp_path, tiny_dir):
    """placement.torch_threads_per_process sets this process's threads for a local run, whatever
    the caller had."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        train(quick_opts(tmp_path, tiny_dir, **{"rl.max_steps": 1}))
        assert torch.get_num_threads() == 1  # the key's default
    finally:
        torch.set_num_threads(before)
