"""The DPO entry end to end on a tiny setting: tools, training, evaluation, resume, CLI errors
(on Ray: tests/test_dpo_ray.py)."""

from __future__ import annotations

import argparse
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

from posttrain.config import ConfigError, load_config
from posttrain.entrypoints import dpo, dpo_tools
from posttrain.entrypoints.cli import main as cli_main
from posttrain.model.diffusion import build_tiny_unet, new_scheduler, save_pipeline

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny 8x8 pipeline folder and pairs sampled from it by ``make-pairs``."""
    root = tmp_path_factory.mktemp("dpo")
    save_pipeline(root / "base", build_tiny_unet(8, 3, seed=0, channels=(8, 16)), new_scheduler(50))
    args = argparse.Namespace(model=str(root / "base"), out=str(root / "pairs"), pairs_per_class=2,
                              candidates=3, target_color="red", sample_steps=2, eta=1.0,
                              seed=1, valid_only=False)  # fmt: skip
    assert dpo_tools.make_pairs(args) == 0
    return root


def opts_for(root: Path, name: str, **extra) -> list[str]:
    opts = {
        "job.output_root": str(root / "out"),
        "job.name": name,
        "model.name_or_path": str(root / "base"),
        "dpo.pairs_path": str(root / "pairs" / "pairs.jsonl"),
        "dpo.pairs_per_step": 4,
        "dpo.eval_samples_per_class": 2,
        "dpo.sample_steps": 2,
        "rl.lr": 1e-3,
        "rl.lr_schedule": "constant",
        "rl.warmup_steps": 0,
        "rl.max_steps": 4,
        "rl.eval_every": 0,
        "rl.save_every": 2,
        "rl.micro_batch_size": 2,
        "logging.progress": False,
    }
    opts.update(extra)
    return [f"{k}={v}" for k, v in opts.items()]


def train(opts: list[str]) -> dict:
    config = load_config("dpo_shapes", ["--", *opts])
    return dpo.run(config, "dpo_shapes", opts, dpo.default_out_dir(config))


def rows(summary: dict) -> dict[int, dict]:
    return rows_in(Path(summary["run_dir"]))


def rows_in(run_dir: Path) -> dict[int, dict]:
    text = (run_dir / "metrics.jsonl").read_text()
    return {r["step"]: r for r in map(json.loads, text.splitlines())}


def weights(summary: dict, step: int) -> dict[str, torch.Tensor]:
    model = Path(summary["run_dir"]) / "checkpoints" / f"step_{step:08d}" / "model"
    return load_file(str(model / "diffusion_pytorch_model.safetensors"))


def test_make_pairs_writes_scored_pairs(base):
    stats = json.loads((base / "pairs" / "stats.json").read_text())
    assert stats["pairs"] == 6 and stats["chosen_scorer_mean"] >= stats["rejected_scorer_mean"]
    assert (base / "pairs" / "candidates.png").is_file()


def test_train_evaluates_and_saves_a_diffusers_checkpoint(base):
    from diffusers import UNet2DModel

    summary = train(opts_for(base, "e2e", **{"rl.eval_every": 2, "rl.max_steps": 3}))
    assert set(summary["initial"]) == {"val/scorer_mean", "val/validity"}
    assert 0 <= summary["final"]["val/validity"] <= 1
    metrics = rows(summary)
    assert sorted(metrics) == [0, 1, 2, 3]
    # Policy == reference before the first update: margin 0 up to kernel rounding.
    assert abs(metrics[1]["train/dpo/reward_margin"]) < 1e-3
    assert metrics[1]["train/loss"] == pytest.approx(0.6931, abs=1e-3)
    assert metrics[3]["train/samples"] == 4 and "val/scorer_mean" in metrics[2]
    grids = sorted(p.name for p in (Path(summary["run_dir"]) / "samples").iterdir())
    assert grids == ["step_000000.png", "step_000002.png", "step_000003.png"]
    UNet2DModel.from_pretrained(
        Path(summary["run_dir"]) / "checkpoints" / "step_00000003" / "model"
    )


def test_stop_and_resume_is_bit_exact(base):
    straight = train(opts_for(base, "straight"))
    train(opts_for(base, "stopped", **{"rl.max_steps": 2}))
    resumed = train(opts_for(base, "stopped"))
    assert resumed["start_step"] == 2
    a, b = rows(straight), rows(resumed)
    for step in (3, 4):
        assert a[step]["train/loss"] == b[step]["train/loss"]
    wa, wb = weights(straight, 4), weights(resumed, 4)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_fine_tune_on_winners_uses_the_same_entry(base):
    summary = train(opts_for(base, "sft", **{"dpo.loss": "sft_chosen", "rl.max_steps": 1}))
    assert not any(k.startswith("train/dpo/") for k in rows(summary)[1])


def test_cli_user_errors_are_one_line(base, tmp_path, capsys):
    assert cli_main(["dpo", "--config", "dpo_shapes", "--", *opts_for(base, "x"),
                     "rl.kl_beta=0.1"]) == 2  # fmt: skip
    assert "rl.kl_beta=0.1 is never read by job.algorithm=dpo" in capsys.readouterr().err
    bad = tmp_path / "pairs.jsonl"
    bad.write_text('{"condition": 0, "chosen": "a.png", "rejected": "b.png"}\n')
    assert cli_main(["dpo", "--config", "dpo_shapes", "--", *opts_for(base, "x"),
                     f"dpo.pairs_path={bad}"]) == 1  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pairs.jsonl:1: image" in err and "does not exist" in err
    assert cli_main(["dpo", "--config", "dpo_shapes", "--", *opts_for(base, "x"),
                     f"model.name_or_path={tmp_path}"]) == 2  # fmt: skip
    assert "not a diffusers pipeline folder" in capsys.readouterr().err


def test_pretrain_tool_writes_a_loadable_pipeline(tmp_path):
    from posttrain.model.diffusion import load_pipeline

    args = argparse.Namespace(out=str(tmp_path / "m"), steps=2, batch_size=4, lr=1e-3,
                              image_size=8, ema_decay=0.995, seed=0)  # fmt: skip
    assert dpo_tools.pretrain(args) == 0
    unet, scheduler = load_pipeline(tmp_path / "m")
    assert unet.config.num_class_embeds == 3 and unet.config.sample_size == 8
    with pytest.raises(ConfigError, match="--ema-decay must be in"):
        dpo_tools.pretrain(argparse.Namespace(**{**vars(args), "ema_decay": 1.0}))


def launch_cli(opts: list[str]) -> subprocess.Popen:
    """``posttrain dpo`` in a child process, on this checkout's sources."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    command = [sys.executable, "-m", "posttrain.entrypoints.dpo", "--config", "dpo_shapes", "--"]
    return subprocess.Popen(
        [*command, *opts], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_kill_9_then_resume_is_bit_exact(base):
    """SIGKILL the entry once a checkpoint exists (it is saving every other step, so the kill
    may land mid-save), resume it, and get the uninterrupted run's weights, optimizer state and
    metrics bit for bit. (The processes' python and numpy RNG states differ and are not
    compared: the entry draws every number from its own seeded generators.)"""
    from test_checkpoint_resume_kill import assert_same_tree

    steps = {"rl.max_steps": 20, "rl.eval_every": 10, "rl.lr_schedule": "cosine",
             "rl.warmup_steps": 3, "checkpoint.keep_last": 2}  # fmt: skip
    killed = launch_cli(opts_for(base, "k_killed", **steps))
    run_dir = base / "out" / "dpo" / "k_killed"
    deadline = time.monotonic() + 120
    while not (run_dir / "checkpoints" / "step_00000002" / "COMPLETE").exists():
        assert killed.poll() is None, killed.communicate()[1]
        assert time.monotonic() < deadline, "the run never saved step 2"
        time.sleep(0.005)
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate()
    assert killed.returncode == -signal.SIGKILL
    final = Path("checkpoints") / "step_00000020"
    assert not (run_dir / final / "COMPLETE").exists(), "the run ended before the kill"
    resumed = launch_cli(opts_for(base, "k_killed", **steps))
    # The uninterrupted run, beside the resume, in this process: the killed and resumed runs are
    # the processes under test. (One torch thread like theirs: placement.torch_threads_per_process,
    # which the run sets.)
    argv = ["dpo", "--config", "dpo_shapes", "--", *opts_for(base, "k_straight", **steps)]
    assert cli_main(argv) == 0
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err

    a, b = rows_in(base / "out" / "dpo" / "k_straight"), rows_in(run_dir)
    assert sorted(a) == sorted(b) == list(range(21))
    for row in (*a.values(), *b.values()):
        row.pop("time/step_s", None)
    assert a == b  # every loss, DPO metric and evaluation
    for name in ("model/diffusion_pytorch_model.safetensors", "trainer.pt"):
        read = load_file if name.endswith(".safetensors") else _load_pt
        assert_same_tree(
            read(base / "out" / "dpo" / "k_straight" / final / name),
            read(run_dir / final / name),
            name,
        )


def _load_pt(path: Path):
    return torch.load(path, weights_only=True)


@pytest.mark.parametrize(
    ("signum", "save_on_signal", "code"),
    [(signal.SIGTERM, True, 143), (signal.SIGINT, False, 130)],
)
def test_a_signal_finishes_the_step_saves_and_resumes(base, signum, save_on_signal, code):
    """SIGTERM (save_on_signal) lets the step finish and saves it; SIGINT without it stops at
    once with the last periodic checkpoint. Either way one line says where to resume from, and
    the same command resumes there with every step recorded exactly once."""
    name = f"sig_{signum}"
    long = {"rl.max_steps": 400, "rl.save_every": 50 if save_on_signal else 2,
            "checkpoint.save_on_signal": save_on_signal}  # fmt: skip
    proc = launch_cli(opts_for(base, name, **long))
    metrics = base / "out" / "dpo" / name / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not metrics.exists() or metrics.read_text().count("\n") < 5:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the run never reached step 5"
        time.sleep(0.02)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"posttrain: stopped by {signal.Signals(signum).name} after step ")
    assert "rerun the same command" in last and "Traceback" not in err
    stopped = int(last.split("after step ")[1].split(";")[0])
    named = Path(last.split("last complete checkpoint: ")[1].split(";")[0])
    saved = int(named.name.removeprefix("step_"))
    assert saved == stopped if save_on_signal else stopped - 2 <= saved <= stopped
    assert (named / "COMPLETE").exists() and not list(named.parent.glob(".tmp-*"))
    resumed = train(opts_for(base, name, **{**long, "rl.max_steps": saved + 1}))
    assert resumed["start_step"] == saved
    assert sorted(rows(resumed)) == list(range(1, saved + 2))


def test_progress_is_plain_lines_into_a_log_file(base):
    """stderr that is not a terminal gets a line at the first step and every logging.log_every
    steps, no bar frames; the evaluations before and after training are announced."""
    proc = launch_cli(opts_for(base, "plain", **{"logging.progress": True, "rl.eval_every": 4,
                                                  "logging.log_every": 2}))  # fmt: skip
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "\r" not in err
    lines = [x for x in err.splitlines() if " step " in x and "/4 " in x]
    assert [x.split(" step ")[1].split()[0] for x in lines] == ["1/4", "2/4", "4/4"], err
    announced = [x.split("posttrain: ")[-1] for x in err.splitlines() if "evaluating on " in x]
    assert [x.split(" (2 per class, fixed seeds) ")[1] for x in announced] == [
        "before training...", "after training...",
    ], err  # fmt: skip
    assert "loss " in lines[0] and "step_s " in lines[0]


def test_an_online_knob_on_the_command_line_is_refused_even_at_its_default(capsys):
    """rollout.n=8 equals the default, so only the command line shows it was asked for."""
    assert cli_main(["dpo", "--config", "dpo_shapes", "--", "rollout.n=8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "posttrain: error: preflight: rollout.n=8 is never read by job.algorithm=dpo (Diffusion "
        "DPO trains offline on dpo.pairs_path); remove it"
    )


def test_config_show_refuses_the_same_online_knob(capsys, tmp_path):
    """config show and posttrain dpo agree: an online knob at its default is still refused."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("")
    opts = ["--", f"dpo.pairs_path={pairs}", "rollout.n=8"]
    assert cli_main(["config", "show", "--config", "dpo_shapes", *opts]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posttrain: error: preflight: rollout.n=8 is never read by job.algorithm")
