"""Ray placement on a local 2-CPU Ray instance (started once for this module).

The arithmetic recipe for three steps in-process, on Ray with one policy rank and on Ray with
two: the same rewards and the same parameters. Builders and reward functions below are at module
scope so the actors import them by name (this file's directory reaches them through the
PYTHONPATH the placement hands its workers).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from safetensors.torch import load_file  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.config.build import build_objective  # noqa: E402
from posttrain.entrypoints import grpo  # noqa: E402
from posttrain.entrypoints.cli import EXIT_RUN_ERROR, run_guarded  # noqa: E402
from posttrain.entrypoints.common import BuilderError  # noqa: E402
from posttrain.model.tiny import build_tiny_model  # noqa: E402
from posttrain.placement.ray import place_ray  # noqa: E402

STEPS = 3
RAY = {"placement.backend": "ray", "placement.cpus_per_role": 0.5}


def digit_reward(prompt: str, completion: str, answer: str, meta: dict) -> float:
    """Varies across an untrained model's samples, so every step has non-zero advantages."""
    return float(sum(c.isdigit() for c in completion))


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
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    yield
    ray.shutdown()


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
        "reward.functions": "[test_placement_ray:digit_reward]",
        "rl.lr": 0.01,
        "rl.max_steps": STEPS,
        "rl.save_every": STEPS,
        "rl.eval_every": 0,
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


def test_nested_builder_is_refused_before_any_actor_starts(cluster, tmp_path, tiny_dir):
    def nested(rl, ctx):
        return build_objective(rl, ctx)

    opts = opts_for(tmp_path, tiny_dir, **RAY)
    config = load_config("arithmetic", ["--", *opts])
    free = ray.available_resources().get("CPU")
    for bad in (nested, functools.partial(recording_builder, lambda: 0)):
        with pytest.raises(BuilderError, match="module scope|cannot travel to Ray workers"):
            place_ray(config, "arithmetic", opts, bad, str(tmp_path / "run"))
    assert ray.available_resources().get("CPU") == free == 2.0


@pytest.fixture(scope="module")
def runs(cluster, tiny_dir, tmp_path_factory):
    """Three runs of the same recipe and seed: in-process, Ray with 1 policy rank, with 2."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, extra in [
        ("local", {}),
        ("ray1", RAY),
        ("ray2", {**RAY, "placement.policy_ranks": 2}),
    ]:
        rec = root / f"rec_{name}"
        rec.mkdir()
        builder = functools.partial(recording_builder, str(rec))
        summary = train(opts_for(root / name, tiny_dir, **extra), builder)
        out[name] = (summary, records(rec))
    return out


def _comparable(rows: list[dict]) -> list[dict]:
    timing = ("time/", "perf/")
    return [
        {k: v for k, v in r.items() if not k.startswith(timing) and not k.endswith(("per_s", "_s"))}
        for r in rows
    ]


def test_ray_equals_local_exactly(runs, tiny_dir):
    local, ray1 = runs["local"][0], runs["ray1"][0]
    a, b = rows_of(local), rows_of(ray1)
    assert [r["step"] for r in a] == list(range(STEPS + 1))  # step 0: the initial evaluation
    # The rewards vary within groups, so every step moves the weights.
    assert all(r["train/reward_std"] > 0 for r in a[1:])
    assert _comparable(a) == _comparable(b)  # rewards, losses, grad norms: bit-identical
    initial = load_file(str(tiny_dir / "model.safetensors"))
    pa, pb = final_params(local), final_params(ray1)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    assert max(float((pa[k] - initial[k]).abs().max()) for k in pa) > 1e-3


def test_two_policy_ranks_make_the_single_rank_update(runs):
    """Bit-identical here by construction: each step has two mini-batches of 8 rows; one rank
    cuts each into two micro-batches of 4, two ranks take 4 rows of each. Either way the step's
    gradient is the sum of the same two 4-row partial gradients, and a sum of two floats does
    not depend on its order. (With more terms the sums would agree only to float rounding.) A
    dispatcher that gave rank 0 the first half of the batch would put other rows together and
    fail this test."""
    one, two = runs["local"][0], runs["ray2"][0]
    a, b = rows_of(one), rows_of(two)
    assert _comparable(a) == _comparable(b)
    assert all(r["train/objective_weight"] > 0 for r in a[1:])
    pa, pb = final_params(one), final_params(two)
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k


def test_workers_see_the_overrides_and_one_torch_thread(runs):
    (_, local_rec), (_, one), (_, two) = runs["local"], runs["ray1"], runs["ray2"]
    assert [r["pid"] for r in local_rec] == [os.getpid()]
    assert len(one) == 1 and sorted((r["rank"], r["world"]) for r in two) == [(0, 2), (1, 2)]
    for row in one + two:
        assert row["pid"] != os.getpid()  # built inside an actor process
        assert row["lr"] == 0.01  # the command-line override, not the recipe's 1e-3
        assert row["threads"] == 1


def test_killed_policy_rank_stops_the_run_naming_it(cluster, tiny_dir, tmp_path, capsys):
    rec = tmp_path / "rec"
    rec.mkdir()
    opts = opts_for(tmp_path, tiny_dir, **RAY, **{
        "placement.policy_ranks": 2, "rl.max_steps": 500, "rl.save_every": 1,
        "job.name": "killed",
    })  # fmt: skip
    ckpts = tmp_path / "grpo" / "killed" / "checkpoints"
    killed_at: list[float] = []

    def kill_rank_one() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ranks = {r["rank"]: r["pid"] for r in records(rec)}
            if 1 in ranks and (ckpts / "step_00000002" / "COMPLETE").exists():
                killed_at.append(time.monotonic())
                os.kill(ranks[1], signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_rank_one, daemon=True)
    killer.start()

    def cli_body() -> int:
        train(opts, functools.partial(recording_builder, str(rec)))
        return 0

    code = run_guarded(cli_body)
    ended = time.monotonic()
    killer.join(timeout=5)
    assert killed_at, "the run never reached its second checkpoint"
    assert code == EXIT_RUN_ERROR
    # Actor output is forwarded to this stderr too; the CLI's own report is a single line.
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("posttrain:")]
    assert len(err) == 1 and "RoleFailedError" in err[0], err
    assert "policy rank 1" in err[0] and "died" in err[0] and "rl.resume=auto" in err[0]
    assert ended - killed_at[0] < 30
    # The last complete checkpoint loads: weights in HF layout, trainer state, metadata.
    done = sorted(p for p in ckpts.glob("step_*") if (p / "COMPLETE").exists())
    assert done and int(done[-1].name.split("_")[1]) >= 2
    last = done[-1]
    assert load_file(str(last / "model" / "model.safetensors"))
    assert torch.load(last / "trainer.pt", weights_only=True)["global_step"] >= 2
    assert json.loads((last / "meta.json").read_text())["world_size"] == 2
