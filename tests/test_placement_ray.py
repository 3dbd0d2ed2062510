"""Ray placement on the local 2-CPU Ray instance the test session shares (tests/conftest.py).

The arithmetic recipe for three steps in-process and on Ray with two policy ranks: the same
rewards and the same parameters. The builders below are at module scope so the actors import
them by name, as the reward actor imports ``role_fixtures``'s reward function (this file's
directory reaches both through the PYTHONPATH the placement hands its workers).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sysconfig
import threading
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from safetensors.torch import load_file  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.config.build import build_objective  # noqa: E402
from posttrain.config.user_code import BuilderError  # noqa: E402
from posttrain.entrypoints import grpo  # noqa: E402
from posttrain.model.tiny import build_tiny_model  # noqa: E402
from posttrain.placement.ray import place_ray  # noqa: E402
from posttrain.testing import run_numbers  # noqa: E402

STEPS = 3
RAY = {"placement.backend": "ray", "placement.cpus_per_role": 0.5}


def recording_builder(record_dir: str, rl, ctx):
    """Builds the normal objective and notes, from inside the policy process, what it sees."""
    import torch.distributed as dist

    on = dist.is_available() and dist.is_initialized()
    row = {
        "pid": os.getpid(),
        "lr": rl.lr,
        "threads": torch.get_num_threads(),
        "rank": dist.get_rank() if on else 0,
        "world": dist.get_world_size() if on else 1,
    }
    (Path(record_dir) / f"{os.getpid()}.json").write_text(json.dumps(row))
    return build_objective(rl, ctx)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def opts_for(root: Path, model: Path, **extra) -> list[str]:
    opts = {
        "job.output_root": str(root),
        "model.name_or_path": str(model),
        "data.train_size": 60,
        "data.val_size": 4,
        "data.prompts_per_step": 4,
        "rollout.n": 4,
        "rollout.max_tokens": 3,
        "reward.functions": "[role_fixtures:digit_reward]",
        "rl.lr": 0.01,
        "rl.max_steps": STEPS,
        "rl.save_every": STEPS,
        "rl.eval_every": STEPS,  # held-out evaluation before the first and after the last step
        "rl.micro_batch_size": 4,
        "rl.mini_batch_per_replica": 2,
        "logging.progress": False,
    }
    opts.update(extra)
    return [f"{k}={v}" for k, v in opts.items()]


def train(opts: list[str], builder=build_objective) -> dict:
    config = load_config("arithmetic", ["--", *opts])
    return grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config), builder)


def rows_of(summary: dict) -> list[dict]:
    text = (Path(summary["run_dir"]) / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def final_params(summary: dict) -> dict[str, torch.Tensor]:
    ckpt = Path(summary["run_dir"]) / "checkpoints" / f"step_{STEPS:08d}" / "model"
    return load_file(str(ckpt / "model.safetensors"))


def records(path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(path.glob("*.json"))]


def test_nested_builder_is_refused_before_any_actor_starts(ray_cluster, tmp_path, tiny_dir):
    def nested(rl, ctx):
        return build_objective(rl, ctx)

    opts = opts_for(tmp_path, tiny_dir, **RAY)
    config = load_config("arithmetic", ["--", *opts])
    free = ray.available_resources().get("CPU")
    for bad in (nested, functools.partial(recording_builder, lambda: 0)):
        with pytest.raises(BuilderError, match="module scope|cannot travel to Ray workers"):
            place_ray(config, "arithmetic", opts, bad, str(tmp_path / "run"))
    assert ray.available_resources().get("CPU") == free == 2.0


def test_roles_that_do_not_fit_the_cluster_are_refused_before_any_actor_starts(
    ray_cluster, tmp_path, tiny_dir
):
    from posttrain.config import ConfigError
    from posttrain.entrypoints.dpo import build_trainer
    from posttrain.placement.diffusion import place_diffusion

    opts = opts_for(tmp_path, tiny_dir, **RAY, **{"placement.gpus_per_role": 1})
    config = load_config("arithmetic", ["--", *opts])
    with pytest.raises(ConfigError, match=r"ask for 2 GPUs .*x 2 model actors.* has 0"):
        place_ray(config, "arithmetic", opts, build_objective, str(tmp_path / "run"))
    # The DPO entry's single policy actor goes through the same check.
    dpo_opts = ["placement.backend=ray", "placement.gpus_per_role=1"]
    dpo = load_config("dpo_shapes", ["--", *dpo_opts])
    with pytest.raises(ConfigError, match=r"ask for 1 GPUs .*x 1 model actors"):
        place_diffusion(dpo, "dpo_shapes", dpo_opts, build_trainer, str(tmp_path / "dpo"))
    assert ray.available_resources().get("CPU") == 2.0


@pytest.fixture(scope="module")
def runs(ray_cluster, tiny_dir, tmp_path_factory):
    """Two runs of the same recipe and seed: in-process, and on Ray with two policy ranks (one
    Ray rank against in-process: tests/test_role_specs.py and tests/test_multiturn_ray.py)."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, extra in [("local", {}), ("ray2", {**RAY, "placement.policy_ranks": 2})]:
        rec = root / f"rec_{name}"
        rec.mkdir()
        builder = functools.partial(recording_builder, str(rec))
        summary = train(opts_for(root / name, tiny_dir, **extra), builder)
        out[name] = (summary, records(rec))
    return out


def test_two_ray_policy_ranks_make_the_local_run_exactly(runs, tiny_dir):
    """Bit-identical here by construction: each step has two mini-batches of 8 rows; one rank
    cuts each into two micro-batches of 4, two ranks take 4 rows of each. Either way the step's
    gradient is the sum of the same two 4-row partial gradients, and a sum of two floats does
    not depend on its order. (With more terms the sums would agree only to float rounding.) A
    dispatcher that gave rank 0 the first half of the batch would put other rows together and
    fail this test."""
    local, ray2 = runs["local"][0], runs["ray2"][0]
    a, b = rows_of(local), rows_of(ray2)
    assert [r["step"] for r in a] == list(range(STEPS + 1))  # step 0: the initial evaluation
    # The rewards vary within groups, so every step moves the weights.
    assert all(r["train/reward_std"] > 0 for r in a[1:])
    assert all(r["train/objective_weight"] > 0 for r in a[1:])
    assert run_numbers(a) == run_numbers(b)  # rewards, losses, grad norms: bit-identical
    initial = load_file(str(tiny_dir / "model.safetensors"))
    pa, pb = final_params(local), final_params(ray2)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    assert max(float((pa[k] - initial[k]).abs().max()) for k in pa) > 1e-3


def test_workers_see_the_overrides_and_one_torch_thread(runs):
    (_, local_rec), (_, two) = runs["local"], runs["ray2"]
    assert [r["pid"] for r in local_rec] == [os.getpid()]
    assert sorted((r["rank"], r["world"]) for r in two) == [(0, 2), (1, 2)]
    for row in two:
        assert row["pid"] != os.getpid()  # built inside an actor process
        assert row["lr"] == 0.01  # the command-line override, not the recipe's 1e-3
        assert row["threads"] == 1


def test_role_errors_are_translated():
    """Without a cluster: how the driver reports what a remote call raised."""
    from ray.exceptions import ActorDiedError, RayTaskError

    from posttrain.config import ConfigError
    from posttrain.placement.errors import RoleFailedError
    from posttrain.placement.ray_actors import ActorGroup
    from posttrain.reward.stage import RewardError

    actors = ActorGroup(checkpoints="/runs/x/checkpoints")

    def remote(cause):
        return RayTaskError("call", "Traceback: ...", cause, proctitle="t", pid=1, ip="127.0.0.1")

    for own in (RewardError("reward function 'm:f' raised"), ConfigError("rl.lr: bad")):
        assert actors._failure({}, "reward", remote(own), []) is own  # as in a local run
    bug = actors._failure({}, "rollout", remote(KeyError("w")), [])
    assert isinstance(bug, RoleFailedError)
    assert str(bug) == "the rollout role failed: KeyError: 'w'"
    died = actors._failure({}, "policy rank 1", ActorDiedError(), [])
    assert isinstance(died, RoleFailedError) and "\n" not in str(died)
    assert str(died).startswith("the policy rank 1 actor died (The actor died unexpectedly")
    assert "/runs/x/checkpoints" in str(died) and "rl.resume=auto" in str(died)


class Sleeper:
    """A stand-in role process: answers its pid, naps on request."""

    def pid(self) -> int:
        return os.getpid()

    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


def test_a_stopped_actor_neither_hangs_the_driver_nor_deafens_it_to_signals(ray_cluster):
    """Issue 24 item 8, on the wait every role call goes through: a call past
    placement.role_call_timeout_s fails in one line naming the role; while a call hangs, a first
    SIGTERM's grace runs out and a second SIGTERM stops at once (not a mangled SystemError)."""
    from posttrain.placement.errors import RoleFailedError
    from posttrain.placement.ray_actors import ActorGroup
    from posttrain.placement.ray_host import worker_pythonpath
    from posttrain.run.signals import GracefulStop, RunInterrupted

    env = {"PYTHONPATH": worker_pythonpath()}
    handle = ray.remote(Sleeper).options(num_cpus=0.1, runtime_env={"env_vars": env}).remote()
    actors = ActorGroup({"reward": handle}, "/runs/x/checkpoints", call_timeout_s=1.0)
    pid = actors.gather([("reward", handle.pid.remote())], 120)[0]
    os.kill(pid, signal.SIGSTOP)
    try:
        began = time.monotonic()
        with pytest.raises(RoleFailedError) as e:
            actors.gather([("reward", handle.nap.remote(0))])
        assert time.monotonic() - began < 5
        assert str(e.value).startswith(
            "the reward role did not answer within placement.role_call_timeout_s=1 s (its "
            "process may be hung or stopped); the run stopped. Complete checkpoints under "
            "/runs/x/checkpoints are intact"
        )
        actors.call_timeout_s = None  # no deadline: only the signals can end the wait
        for grace, kills, reason in ((1.0, 1, "signal_grace_s=1 s"), (60.0, 2, None)):
            with GracefulStop(True, "ck/step_2", grace_s=grace), pytest.raises(RunInterrupted) as e:
                for k in range(kills):
                    threading.Timer(0.2 + 1.5 * k, os.kill, (os.getpid(), signal.SIGTERM)).start()
                began = time.monotonic()
                actors.gather([("reward", handle.nap.remote(0))])
            assert time.monotonic() - began < 5
            assert (reason in str(e.value)) if reason else ("grace" not in str(e.value))
    finally:
        os.kill(pid, signal.SIGCONT)
        actors.close()


def test_a_role_failure_is_one_short_line_naming_role_exception_and_frame():
    """Issue 24 item 14: the role, the exception and the innermost frame of project or user code;
    not Ray's frames, ids or addresses, no escape codes."""
    from ray.exceptions import ActorDiedError, RayTaskError

    from posttrain.placement.ray_actors import ActorGroup

    tb = (
        "Traceback (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/ray/_private/worker.py", line 900, in main\n'
        "    return fn()\n"
        '  File "/home/u/my_objective.py", line 12, in build\n'
        "    raise KeyError('w')\n"
        f'  File "{sysconfig.get_paths()["stdlib"]}/json/decoder.py", line 3, in decode\n'
        "ValueError: w\n" + "ray internals\n" * 40
    )
    error = RayTaskError("call", tb, ValueError("\x1b[31mw"), proctitle="t", pid=1, ip="10.0.0.1")
    failed = str(ActorGroup()._failure({}, "policy rank 0", error, []))
    assert failed == (
        "the policy rank 0 role failed: ValueError: w (at /home/u/my_objective.py:12 in build)"
    )
    died = str(ActorGroup()._failure({}, "reward", ActorDiedError(error), []))
    assert len(died) < 400 and "\n" not in died


def test_the_placement_line_of_a_ray_run_names_every_actor():
    from posttrain.placement.ray import placement_line
    from posttrain.placement.reference import REFERENCE

    fsdp = ["placement.backend=ray", "placement.policy_ranks=2", "placement.policy_sharding=fsdp"]
    assert placement_line(load_config("arithmetic_clipped", ["--", *fsdp])) == (
        "placement: Ray, policy on 2 actor(s) on cpu (FSDP-sharded, float32 master, float32 "
        "compute), reference sharded over the policy actors (float32), rollout actor on cpu "
        "(float32, own copy), reward actor on cpu; 1 torch thread(s) per actor"
    )
    replicated = load_config("arithmetic_clipped", ["--", "placement.backend=ray"])
    assert ", reference in each policy actor (float32)," in placement_line(replicated)
    lagged = load_config(
        "arithmetic_clipped", ["--", "placement.backend=ray", "rl.off_policy_lag=1"]
    )
    line = placement_line(lagged, [REFERENCE])
    assert "reference in each" not in line and ", reference actor on cpu;" in line
