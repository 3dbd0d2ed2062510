"""The OPD entry end to end on tiny models: the teacher phase, the step-0 identity, entry
refusals, the shared-tokenizer check and an exact resume after kill -9."""

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
from posttrain.entrypoints import opd
from posttrain.entrypoints.cli import EXIT_CONFIG_ERROR, main
from posttrain.model.tiny import build_tiny_model
from posttrain.run.records import default_out_dir

REPO = Path(__file__).resolve().parents[1]
RECIPE = "opd_arithmetic"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("opd_entry")
    return {
        "student": build_tiny_model("arith", root / "student", seed=0),
        "teacher": build_tiny_model("arith", root / "teacher", seed=1),
        "other": build_tiny_model("tiny", root / "other", seed=0),
    }


def opd_opts(tmp: Path, models, teacher: str = "teacher", **extra) -> list[str]:
    opts = {
        "job.output_root": str(tmp / "out"),
        "model.name_or_path": str(models["student"]),
        "teacher.name_or_path": str(models[teacher]),
        "data.train_size": 40,
        "data.val_size": 4,
        "data.prompts_per_step": 4,
        "rollout.n": 4,
        "rl.max_steps": 3,
        "rl.save_every": 3,
        "rl.eval_every": 3,
        "rl.micro_batch_size": 8,
        "logging.progress": False,
    }
    opts.update(extra)
    return [f"{k}={v}" for k, v in opts.items()]


def train(opts: list[str]) -> dict:
    config = load_config(RECIPE, ["--", *opts])
    return opd.run(config, RECIPE, opts, default_out_dir(config))


def rows_of(run_dir) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["advantage", "direct"])
def test_opd_run_scores_with_the_teacher_and_publishes_opd_metrics(tmp_path, models, mode):
    summary = train(opd_opts(tmp_path, models, **{"rl.distillation_mode": mode}))
    run_dir = Path(summary["run_dir"])
    assert run_dir == tmp_path / "out" / "opd" / "opd_arithmetic"
    rows = rows_of(run_dir)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    step = rows[1]
    assert {"train/opd/reverse_kl", "train/opd/teacher_logprob_mean", "time/teacher_s"} <= set(step)
    assert step["train/opd/reverse_kl"] > 1e-4  # two different (near-uniform) random models
    if mode == "direct":
        assert step["train/opd/divergence"] > 0 and "train/pg/ratio_mean" not in step
    else:
        assert step["train/pg/ratio_mean"] == 1.0
    assert "distillation_mode: " + mode in (run_dir / "config.yaml").read_text()


@pytest.mark.parametrize("mode", ["advantage", "direct"])
def test_student_equal_to_teacher_has_zero_reverse_kl_and_zero_advantage(tmp_path, models, mode):
    opts = opd_opts(tmp_path, models, **{"rl.distillation_mode": mode, "rl.max_steps": 1,
                                         "teacher.name_or_path": str(models["student"])})  # fmt: skip
    first = rows_of(train(opts)["run_dir"])[1]
    assert abs(first["train/opd/reverse_kl"]) < 1e-6
    if mode == "advantage":
        assert abs(first["train/opd/advantage_mean"]) < 1e-6 and abs(first["train/loss"]) < 1e-6
    else:
        assert abs(first["train/opd/divergence"]) < 1e-6


def _cli(capsys, *argv) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().err.strip()


def test_each_entry_refuses_the_other_algorithm_in_one_line(tmp_path, models, capsys):
    code, err = _cli(capsys, "grpo", "--config", RECIPE, "--", *opd_opts(tmp_path, models))
    assert code == EXIT_CONFIG_ERROR and "run `posttrain opd" in err and "\n" not in err
    code, err = _cli(capsys, "opd", "--config", "arithmetic", "--", "logging.progress=false")
    assert code == EXIT_CONFIG_ERROR and "run `posttrain grpo --config ...`" in err
    assert "\n" not in err
    assert not (tmp_path / "out").exists()


def test_a_teacher_with_another_tokenizer_stops_before_any_model_loads(tmp_path, models, capsys):
    opts = opd_opts(tmp_path, models, teacher="other")
    code, err = _cli(capsys, "opd", "--config", RECIPE, "--", *opts)
    assert code == EXIT_CONFIG_ERROR and "different tokenizer than the student" in err
    assert "\n" not in err and not (tmp_path / "out").exists()


def _kill_opts(tmp: Path, models, name: str, steps: int) -> list[str]:
    """A run in the advantage mode, whose clipped surrogate's π_old cache resume must restore."""
    return opd_opts(tmp, models, **{"job.name": name, "rl.max_steps": steps, "rl.save_every": 2,
                                    "rl.eval_every": 0, "rl.distillation_mode": "advantage"})  # fmt: skip


def _launch(tmp: Path, models, name: str, steps: int) -> subprocess.Popen:
    opts = _kill_opts(tmp, models, name, steps)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "posttrain.entrypoints.opd", "--config", RECIPE, "--", *opts]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _final_params(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(
        str(run_dir / "checkpoints" / f"step_{step:08d}" / "model" / "model.safetensors")
    )


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))
             and not k.endswith(("per_s", "_s"))} for r in rows]  # fmt: skip


def test_kill_9_mid_run_then_resume_is_bit_exact(tmp_path, models):
    steps = 6
    killed = _launch(tmp_path, models, "killed", steps)
    metrics = tmp_path / "out" / "opd" / "killed" / "checkpoints" / "step_00000004"
    deadline = time.monotonic() + 120
    while not (metrics / "COMPLETE").exists():
        assert killed.poll() is None, killed.communicate()[1]
        assert time.monotonic() < deadline, "the run never saved step 4"
        time.sleep(0.02)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    resumed = _launch(tmp_path, models, "killed", steps)
    # The uninterrupted run, beside the resume, in this process (one torch thread, as the run
    # sets it): the killed and resumed runs are the processes under test.
    straight = _kill_opts(tmp_path, models, "straight", steps)
    assert main(["opd", "--config", RECIPE, "--", *straight]) == 0
    assert resumed.wait(timeout=120) == 0, resumed.communicate()[1]
    a_dir, b_dir = (tmp_path / "out" / "opd" / n for n in ("straight", "killed"))
    assert _comparable(rows_of(a_dir)) == _comparable(rows_of(b_dir))
    pa, pb = _final_params(a_dir, steps), _final_params(b_dir, steps)
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def test_objective_flag_names_the_builder_by_import_path(tmp_path, models, capsys):
    opts = opd_opts(tmp_path, models, **{"rl.max_steps": 1, "rl.eval_every": 0})
    code, err = _cli(capsys, "opd", "--config", RECIPE, "--objective",
                     "posttrain.algorithm.opd:make_objective", "--", *opts)  # fmt: skip
    assert code == 0, err
    code, err = _cli(capsys, "opd", "--config", RECIPE, "--objective", "posttrain.nowhere:f",
                     "--", *opts)  # fmt: skip
    assert code == EXIT_CONFIG_ERROR and "posttrain.nowhere" in err and "\n" not in err
