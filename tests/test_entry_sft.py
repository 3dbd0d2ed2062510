"""The SFT entry end to end on the tiny recipe: training, evaluation, export, LoRA, resume
(stop and kill -9, bit-exact), and its one-line user errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain.config import load_config
from posttrain.configs.sft_tools_tiny import DATA, demonstrations
from posttrain.data.order import step_indices
from posttrain.entrypoints import sft
from posttrain.entrypoints.cli import main as cli_main
from posttrain.run.online import ensure_model

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


def opts_for(root: Path, name: str, **extra) -> list[str]:
    opts = {
        "job.output_root": str(root / "out"),
        "job.name": name,
        "model.name_or_path": str(root / "model"),
        "sft.train_path": str(REPO / DATA / "train.jsonl"),
        "sft.val_path": str(REPO / DATA / "val.jsonl"),
        "sft.rows_per_step": 8,
        "rl.max_steps": 4,
        "rl.eval_every": 2,
        "rl.save_every": 2,
        "logging.progress": False,
    }
    opts.update(extra)
    return [f"{k}={v}" for k, v in opts.items()]


def train(opts: list[str]) -> dict:
    config = load_config("sft_tools_tiny", ["--", *opts])
    return sft.run(config, "sft_tools_tiny", opts)


def rows_in(run_dir: Path) -> dict[int, dict]:
    text = (run_dir / "metrics.jsonl").read_text()
    return {r["step"]: r for r in map(json.loads, text.splitlines())}


def test_the_fixture_files_are_the_recipes_demonstrations():
    for name, rows in zip(("train", "val"), demonstrations(), strict=True):
        text = (REPO / DATA / f"{name}.jsonl").read_text()
        assert text == "".join(json.dumps(r) + "\n" for r in rows)
    train_rows, val_rows = demonstrations()
    assert not {json.dumps(r) for r in train_rows} & {json.dumps(r) for r in val_rows}


def test_train_evaluates_saves_and_exports(tmp_path):
    from transformers import AutoModelForCausalLM

    summary = train(opts_for(tmp_path, "e2e"))
    metrics = rows_in(Path(summary["run_dir"]))
    assert sorted(metrics) == [0, 1, 2, 3, 4]
    assert set(summary["initial"]) == {"val/loss", "val/token_accuracy", "val/tokens"}
    assert summary["final"]["val/loss"] < summary["initial"]["val/loss"]
    data, _ = sft.load_data(load_config("sft_tools_tiny", ["--", *opts_for(tmp_path, "e2e")]))
    step_rows = step_indices(len(data.rows), 0, 1, 8).tolist()
    assert metrics[1]["train/sft/tokens"] == sum(sum(data.rows[i].mask) for i in step_rows)
    AutoModelForCausalLM.from_pretrained(summary["final_model"])
    saved = load_config(str(Path(summary["run_dir"]) / "config.yaml"))
    assert saved.job.algorithm == "sft" and saved.sft.rows_per_step == 8


def test_lora_and_gradient_checkpointing_train_through_the_policy_role(tmp_path):
    summary = train(opts_for(tmp_path, "lora", **{
        "model.lora_rank": 4, "model.lora_target_modules": "[q_proj,v_proj]",
        "model.gradient_checkpointing": True, "rl.max_steps": 2, "rl.lr": 1e-2,
        "rl.micro_batch_tokens": 64}))  # fmt: skip
    assert summary["final"]["val/loss"] < summary["initial"]["val/loss"]


def test_bf16_compute_trains_through_the_trainers_precision_path(tmp_path):
    summary = train(opts_for(tmp_path, "bf16", **{"model.dtype": "bfloat16", "rl.max_steps": 2}))
    metrics = rows_in(Path(summary["run_dir"]))
    assert all(torch.isfinite(torch.tensor(metrics[s]["train/loss"])) for s in (1, 2))
    assert summary["final"]["val/loss"] < summary["initial"]["val/loss"]


def test_packed_training_matches_unpacked_training(tmp_path):
    """``sft.packing``: the same rows in fewer sequences give the same loss, to rounding."""
    plain = train(opts_for(tmp_path, "plain", **{"rl.max_steps": 2}))
    packed = train(
        opts_for(
            tmp_path, "packed", **{"rl.max_steps": 2, "sft.packing": True, "sft.max_tokens": 128}
        )
    )  # 3 rows a sequence
    a, b = rows_in(Path(plain["run_dir"])), rows_in(Path(packed["run_dir"]))
    for step in (1, 2):
        assert b[step]["train/loss"] == pytest.approx(a[step]["train/loss"], abs=1e-5)
        assert b[step]["train/sft/tokens"] == a[step]["train/sft/tokens"]


def test_stop_and_resume_is_bit_exact(tmp_path):
    straight = train(opts_for(tmp_path, "straight"))
    train(opts_for(tmp_path, "stopped", **{"rl.max_steps": 2}))
    resumed = train(opts_for(tmp_path, "stopped"))
    assert resumed["start_step"] == 2
    a, b = rows_in(Path(straight["run_dir"])), rows_in(Path(resumed["run_dir"]))
    for step in (3, 4):
        assert a[step]["train/loss"] == b[step]["train/loss"]
    weights = [
        load_file(str(Path(s["final_model"]) / "model.safetensors")) for s in (straight, resumed)
    ]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def launch_cli(
    opts: list[str], entry: str = "sft", recipe: str = "sft_tools_tiny"
) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    command = [sys.executable, "-m", f"posttrain.entrypoints.{entry}", "--config", recipe, "--"]
    return subprocess.Popen(
        [*command, *opts], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


KILL_STEPS = {"rl.max_steps": 30, "rl.eval_every": 10, "rl.lr_schedule": "cosine",
              "rl.warmup_steps": 3, "checkpoint.keep_last": 2}  # fmt: skip


def newest_complete(ckpts: Path) -> int:
    """The step of the newest checkpoint with its COMPLETE marker (0: none), what a resume
    starts from."""
    done = [int(p.name.removeprefix("step_")) for p in ckpts.glob("step_*")
            if (p / "COMPLETE").exists()]  # fmt: skip
    return max(done, default=0)


def stops_then_resume(root: Path, entry: str, recipe: str, opts_for) -> None:
    """SIGTERM the entry once a checkpoint exists (it finishes the step, saves it and exits
    143), resume it, SIGKILL the resumed run once it has saved again, then resume once more: the
    run ends with the uninterrupted run's weights, optimizer state and metrics bit for bit. One
    chain for both signals; each resume is checked to start from what the last stop left.

    The uninterrupted run goes through the command line in this process; the stopped and
    resumed runs are the processes under test."""
    from test_checkpoint_resume_kill import assert_same_tree

    ensure_model(load_config(recipe, ["--", *opts_for(root, "m")]))
    assert (
        cli_main([entry, "--config", recipe, "--", *opts_for(root, "straight", **KILL_STEPS)]) == 0
    )
    straight = root / "out" / entry / "straight"
    opts = opts_for(root, "stopped", **KILL_STEPS)
    run_dir = root / "out" / entry / "stopped"
    final = Path("checkpoints") / "step_00000030"
    for stop, status in ((signal.SIGTERM, 143), (signal.SIGKILL, -signal.SIGKILL)):
        before = newest_complete(run_dir / "checkpoints")
        proc = launch_cli(opts, entry, recipe)
        deadline = time.monotonic() + 120
        while newest_complete(run_dir / "checkpoints") <= before:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, f"the run never saved a step after {before}"
            time.sleep(0.005)
        os.kill(proc.pid, stop)
        _, err = proc.communicate()
        assert proc.returncode == status, err[-3000:]
        assert before == 0 or f"resuming from step {before}" in err, err[-3000:]
        assert not (run_dir / final / "COMPLETE").exists(), f"the run ended before {stop.name}"
    before = newest_complete(run_dir / "checkpoints")
    resumed = launch_cli(opts, entry, recipe)
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0 and f"resuming from step {before}" in err, err[-3000:]
    a, b = rows_in(straight), rows_in(run_dir)
    assert sorted(a) == sorted(b) == list(range(31))
    for row in (*a.values(), *b.values()):
        row.pop("time/step_s", None)
    assert a == b
    for name in ("model/model.safetensors", "trainer.pt"):
        read = load_file if name.endswith(".safetensors") else _load_pt
        assert_same_tree(read(straight / final / name), read(run_dir / final / name), name)


def test_sigterm_then_sigkill_then_resume_is_bit_exact(tmp_path):
    stops_then_resume(tmp_path, "sft", "sft_tools_tiny", opts_for)


def _load_pt(path: Path):
    return torch.load(path, map_location="cpu", weights_only=False)


def _cli(capsys, *argv) -> tuple[int, str]:
    code = cli_main(list(argv))
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["rollout.n=8"], "rollout.n=8 is never read by job.algorithm=sft (SFT trains offline"),
        (["rl.kl_beta=0.1"], "rl.kl_beta=0.1 is never read by job.algorithm=sft"),
        (["sft.train_path=@default"], "sft.train_path is not set"),
        (["sft.rows_per_step=2", "placement.backend=ray", "placement.policy_ranks=3"],
         "sft.rows_per_step=2 gives some of placement.policy_ranks=3 no row"),
        (["job.algorithm=grpo"], "job.algorithm=grpo is a GRPO-family algorithm (online RL), "
         "which `posttrain sft` does not train"),
    ],
)  # fmt: skip
def test_config_errors_are_one_line(tmp_path, capsys, extra, fragment):
    code, err = _cli(capsys, "sft", "--config", "sft_tools_tiny", "--",
                     *opts_for(tmp_path, "x"), *extra)  # fmt: skip
    assert code == 2 and fragment in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_bad_row_stops_the_run_before_anything_is_written(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    good = (REPO / DATA / "train.jsonl").read_text().splitlines()
    bad.write_text("\n".join([*good[:5], '{"messages": [{"role": "user", "content": "1"}]}',
                              *good[5:]]) + "\n")  # fmt: skip
    code, err = _cli(capsys, "sft", "--config", "sft_tools_tiny", "--",
                     *opts_for(tmp_path, "x", **{"sft.train_path": bad}))  # fmt: skip
    assert code == 2 and f"{bad}:6: no assistant turn" in err and "\n" not in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "model").exists()
    code, err = _cli(capsys, "config", "show", "--config", "sft_tools_tiny", "--",
                     *opts_for(tmp_path, "x", **{"sft.train_path": bad}))  # fmt: skip
    assert code == 2 and f"{bad}:6: no assistant turn" in err


def test_fewer_held_out_rows_than_ranks_is_one_line_before_ray_starts(tmp_path, capsys):
    val = tmp_path / "one.jsonl"
    val.write_text((REPO / DATA / "val.jsonl").read_text().splitlines(True)[0])
    extra = {"sft.val_path": val, "placement.backend": "ray", "placement.policy_ranks": 2}
    code, err = _cli(capsys, "sft", "--config", "sft_tools_tiny", "--",
                     *opts_for(tmp_path, "x", **extra))  # fmt: skip
    assert code == 2 and "\n" not in err, err
    assert f"{val} has 1 held-out row, fewer than placement.policy_ranks=2" in err
    assert not (tmp_path / "out").exists()


def test_an_online_entry_refuses_the_sft_recipe(capsys):
    code, err = _cli(capsys, "grpo", "--config", "sft_tools_tiny")
    assert code == 2 and "job.algorithm=sft is supervised fine-tuning" in err
    assert "run `posttrain sft --config ...`" in err
