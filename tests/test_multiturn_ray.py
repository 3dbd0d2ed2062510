"""Multi-turn under Ray: the environments run in the reward actor, and the run equals local."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from multiturn_fixtures import build_tools_model  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.config.build import build_objective  # noqa: E402
from posttrain.entrypoints import grpo  # noqa: E402


@pytest.fixture
def pid_dir(ray_cluster, tmp_path, monkeypatch):
    """Where the environments note their process: ``mt_pids`` of the driver's working directory,
    which the Ray actors work in too."""
    monkeypatch.chdir(tmp_path)
    where = tmp_path / "mt_pids"
    where.mkdir()
    return where


def _run(root: Path, model: Path, name: str, **extra) -> list[dict]:
    opts = {
        "job.name": name, "job.output_root": str(root), "model.name_or_path": str(model),
        "data.train_size": 16, "data.val_size": 4, "data.prompts_per_step": 2, "rollout.n": 4,
        "rollout.max_tokens": 6, "rl.max_steps": 2, "rl.save_every": 2, "rl.eval_every": 2,
        "rl.micro_batch_size": 8, "logging.progress": False,
        "env.name": "role_fixtures:pid_chatty", "env.max_turns": 3, "env.max_context": 120,
        "reward.functions": "[role_fixtures:length_reward]", **extra,
    }  # fmt: skip
    opts = [f"{k}={v}" for k, v in opts.items()]
    config = load_config("arithmetic", ["--", *opts])
    summary = grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config), build_objective)
    rows = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(r) for r in rows]


def test_environments_run_in_the_reward_actor_and_ray_equals_local(pid_dir, tmp_path) -> None:
    model = build_tools_model(tmp_path / "model")
    local = _run(tmp_path / "out", model, "mt-local")
    assert {p.name for p in pid_dir.iterdir()} == {str(os.getpid())}
    for p in pid_dir.iterdir():
        p.unlink()
    remote = _run(tmp_path / "out", model, "mt-ray", **{
        "placement.backend": "ray", "placement.cpus_per_role": 0.5})  # fmt: skip
    pids = {p.name for p in pid_dir.iterdir()}
    assert len(pids) == 1 and str(os.getpid()) not in pids  # one process: the reward actor
    keys = ("train/loss", "train/env/turns_mean", "train/env/env_tokens_mean", "val/accuracy",
            "train/env/nudges_mean", "val/env/nudges_mean")  # fmt: skip
    # the environment's own info key, declared in the reward actor, reaches the driver's metrics
    assert "train/env/nudges_mean" in remote[1] and "val/env/nudges_mean" in remote[-1]
    for a, b in zip(local, remote, strict=True):
        for k in keys:
            if k in a:
                assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), k
