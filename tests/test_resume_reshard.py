"""Resume across placements (issue 33): the rank count, the sharding and the backend are where
a run's steps execute, not what it is, so one run directory is continued a step at a time on 2
FSDP Ray ranks, 1, one local process and 2 replicated Ray ranks (each command resumes and trains
its step once: sharded 2 -> 1 -> unsharded -> replicated; the second and the last through the
command line, the other two in this process); a replicated
checkpoint into sharded ranks, the one combination the checkpoint formats cannot load, is
refused in one line naming the fix, and nothing in the run directory changes.

The last command (a CLI driver that joined the shared Ray instance by address) is left running
and one of its two policy ranks is killed once it has saved its step: the driver exits non-zero
within a bounded time with one line naming the role (the surviving rank, blocked in a
collective, is ended, not waited on), and the last complete checkpoint loads."""

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

pytest.importorskip("ray")

from safetensors.torch import load_file  # noqa: E402
from test_entry_grpo import train  # noqa: E402
from test_fsdp_ray import policy_host_pids  # noqa: E402

from posttrain.entrypoints.cli import EXIT_RUN_ERROR  # noqa: E402
from posttrain.model.tiny import build_tiny_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RUN = Path("grpo") / "reshard"
FSDP = {"placement.backend": "ray", "placement.policy_sharding": "fsdp"}
REPLICATED = {"placement.backend": "ray"}
LOCAL = {"placement.backend": "local"}  # the Ray knobs are refused there: left at defaults
#: (placement, ranks) of each command; command k trains step k + 2 (the first trains 1-2).
PLACEMENTS = [(FSDP, 2), (FSDP, 1), (LOCAL, 1), (REPLICATED, 2)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def overrides(cwd: Path, tiny: Path, ray: str, steps: int, placement: dict, ranks: int):
    opts = {
        "job.name": "reshard", "job.output_root": str(cwd), "model.name_or_path": str(tiny),
        "data.train_size": 60, "data.val_size": 4, "data.prompts_per_step": 4, "rollout.n": 4,
        "rollout.max_tokens": 3, "reward.functions": "[role_fixtures:digit_reward]",
        "rl.lr": 0.01, "rl.max_steps": steps, "rl.save_every": 1, "rl.eval_every": 0,
        "checkpoint.keep_last": 10,
        "rl.micro_batch_size": 3, "rl.mini_batch_per_replica": 2, "logging.progress": False,
        **placement,
    }  # fmt: skip
    if placement["placement.backend"] == "ray":
        opts |= {"placement.cpus_per_role": 0.5, "placement.ray_address": ray,
                 "placement.policy_ranks": ranks}  # fmt: skip
    return [f"{k}={v}" for k, v in opts.items()]


def command(cwd: Path, tiny: Path, ray: str, steps: int, placement: dict, ranks: int):
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}"}
    cmd = [sys.executable, "-m", "posttrain.entrypoints.grpo", "--config", "arithmetic", "--"]
    return [*cmd, *overrides(cwd, tiny, ray, steps, placement, ranks)], env


def here(cwd: Path, tiny: Path, ray: str, steps: int, placement: dict, ranks: int) -> dict:
    """The same command run in this process (it joins the session's Ray instance)."""
    return train(overrides(cwd, tiny, ray, steps, placement, ranks))


def grpo(cwd: Path, tiny: Path, ray: str, steps: int, placement: dict, ranks: int):
    cmd, env = command(cwd, tiny, ray, steps, placement, ranks)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


#: The last command's step limit: it is stopped by the kill, never by the limit.
ENDLESS = 1000


def killed_mid_run(cwd: Path, tiny: Path, ray: str, step: int, placement: dict, ranks: int):
    """The command run until it has saved step ``step``; then one policy rank is SIGKILLed.
    Returns the driver's stderr and the seconds it took to exit after the kill."""
    cmd, env = command(cwd, tiny, ray, ENDLESS, placement, ranks)
    driver = subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)  # fmt: skip
    saved = cwd / RUN / "checkpoints" / f"step_{step:08d}" / "COMPLETE"
    deadline = time.monotonic() + 240
    while not saved.exists():
        assert driver.poll() is None, driver.communicate()[1][-4000:]
        assert time.monotonic() < deadline, f"the run never saved step {step}"
        time.sleep(0.05)
    victims = policy_host_pids(cwd.resolve())
    assert len(victims) == ranks, victims
    os.kill(victims[-1], signal.SIGKILL)
    killed = time.monotonic()
    _, stderr = driver.communicate(timeout=60)
    assert driver.returncode == EXIT_RUN_ERROR, stderr[-4000:]
    return stderr, time.monotonic() - killed


@pytest.fixture(scope="module")
def resumed(ray_cluster, tiny, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("reshard")
    # The first and the third command run in this process: what the command line adds (the
    # report, a Ray-forwarded warning) is checked on the second and the last.
    runs = [here(cwd, tiny, ray_cluster, 2, *PLACEMENTS[0])]
    cli = grpo(cwd, tiny, ray_cluster, 3, *PLACEMENTS[1])
    assert cli.returncode == 0, f"command 1 {PLACEMENTS[1]}:\n{cli.stderr[-4000:]}"
    runs += [cli, here(cwd, tiny, ray_cluster, 4, *PLACEMENTS[2])]
    killed = killed_mid_run(cwd, tiny, ray_cluster, len(PLACEMENTS) + 1, *PLACEMENTS[-1])
    return cwd, tiny, runs, killed


def last_complete(cwd: Path) -> Path:
    done = [p for p in (cwd / RUN / "checkpoints").glob("step_*") if (p / "COMPLETE").exists()]
    return max(done)


def test_each_placement_resumes_the_last_and_trains_its_step_once(resumed):
    cwd, _, (first, cli, local), (killed, _) = resumed
    assert first["start_step"] == 0 and first["steps"] == 2
    assert "resuming from step 2" in cli.stderr, cli.stderr[-3000:]
    assert "trained 1 steps" in cli.stdout, cli.stdout
    assert local["start_step"] == 3 and local["steps"] == 4
    assert f"resuming from step {len(PLACEMENTS)}" in killed, killed[-3000:]
    rows = [json.loads(x) for x in (cwd / RUN / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > len(PLACEMENTS)
    ckpts = cwd / RUN / "checkpoints"
    assert (ckpts / "step_00000002" / "dcp").is_dir()  # the sharded formats were really used
    assert not (ckpts / "step_00000005" / "dcp").exists()


def test_a_killed_policy_rank_stops_a_cli_run_that_joined_the_cluster(resumed):
    cwd, _, _, (stderr, exit_s) = resumed
    assert exit_s < 30
    # Actor output is forwarded to the driver's stderr too; the CLI's own report is one line.
    report = [ln for ln in stderr.splitlines() if ln.startswith("posttrain:")]
    assert len(report) == 1 and "RoleFailedError" in report[0], stderr[-4000:]
    assert "policy rank" in report[0] and "died" in report[0] and "rl.resume=auto" in report[0]
    # a Ray run says where it placed the roles, as a local run does
    assert "posttrain: placement: Ray, policy on 2 actor(s) on cpu (replicated," in stderr
    last = last_complete(cwd)
    assert int(last.name.split("_")[1]) >= len(PLACEMENTS) + 1
    assert load_file(str(last / "model" / "model.safetensors"))
    assert torch.load(last / "trainer.pt", weights_only=True)["global_step"] >= 5
    assert json.loads((last / "meta.json").read_text())["world_size"] == 2


def test_a_changed_rank_count_warns_that_rounding_may_differ(resumed):
    _, _, runs, _ = resumed
    line = "placement.policy_ranks changed from 2 to 1: the gradient is summed over"
    assert line in runs[1].stderr, runs[1].stderr[-3000:]


def test_a_replicated_checkpoint_into_sharded_ranks_is_refused_in_one_line(resumed, ray_cluster):
    cwd, tiny, _, _ = resumed
    before = sorted(p.name for p in (cwd / RUN).rglob("*"))
    refused = grpo(cwd, tiny, ray_cluster, ENDLESS, FSDP, 2)
    err = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert err.startswith("posttrain: error: ResumeError: ") and "cannot be resharded" in err
    assert f"{last_complete(cwd).name} is a replicated checkpoint" in err, err
    assert "resume it with placement.policy_sharding=none" in err
    assert sorted(p.name for p in (cwd / RUN).rglob("*")) == before
