"""FSDP policy ranks through the Ray entry: the arithmetic recipe for four steps in-process
(one unsharded rank) and on Ray with two FSDP ranks give the same run (to float rounding), the
sharded run ends with ``RUN_DIR/final_model``, a folder ``from_pretrained`` loads whose weights
are the final sharded checkpoint's bit for bit (read back independently with DCP's own
converter; rank 1 loaded a meta-device skeleton), and a CLI run on
two FSDP ranks whose rank is killed with SIGKILL resumes to that run's numbers and shards, bit
for bit.

Both runs anchor to a KL reference that resets every two steps (``rl.reference_reset_every``):
under FSDP the reference is sharded like the policy and a reset copies shard to shard, so the
sharded run must still make the unsharded one; the kill comes after the step-2 checkpoint, the
first written after a reset, so the resume also reads the reset reference's shards back."""

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

ray = pytest.importorskip("ray")

from safetensors.torch import load_file  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.config.build import build_objective  # noqa: E402
from posttrain.entrypoints import grpo  # noqa: E402
from posttrain.model.tiny import build_tiny_model  # noqa: E402
from posttrain.run.records import FINAL_DIR  # noqa: E402
from posttrain.trainer.export import export_hf  # noqa: E402

STEPS = 4
REPO = Path(__file__).resolve().parents[1]
FSDP = {
    "placement.backend": "ray",
    "placement.cpus_per_role": 0.5,
    "placement.policy_ranks": 2,
    "placement.policy_sharding": "fsdp",
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def opts_for(root: Path, tiny: Path, **extra) -> list[str]:
    opts = {
        "job.output_root": str(root),
        "model.name_or_path": str(tiny),
        "data.train_size": 60,
        "data.val_size": 4,
        "data.prompts_per_step": 4,
        "rollout.n": 4,
        "rollout.max_tokens": 3,
        "reward.functions": "[role_fixtures:digit_reward]",
        "rl.lr": 0.01,
        "rl.grpo_surrogate": "clipped",
        "rl.kl_beta": 0.1,
        "rl.reference_reset_every": 2,
        "rl.max_steps": STEPS,
        "rl.save_every": 2,
        "rl.eval_every": 0,
        # 5 rows a rank in one micro-batch and 3 in the other: ranks run unequal numbers of
        # micro-batches, so the lockstep padding is exercised.
        "rl.micro_batch_size": 3,
        "rl.mini_batch_per_replica": 2,
        # Prompt sharing regroups micro-batches by prompt, and the two layouts (one rank, two)
        # then differ in forward rounding too; off, the comparison isolates FSDP's own.
        "rl.shared_prefix": "off",
        "logging.progress": False,
        **extra,
    }
    return [f"{k}={v}" for k, v in opts.items()]


@pytest.fixture(scope="module")
def runs(ray_cluster, tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, extra in [("local", {}), ("fsdp2", FSDP)]:
        opts = opts_for(root / name, tiny, **extra)
        config = load_config("arithmetic", ["--", *opts])
        out[name] = grpo.run(
            config, "arithmetic", opts, grpo.default_out_dir(config), build_objective
        )
    return tiny, out


def rows_of(summary: dict) -> list[dict]:
    text = (Path(summary["run_dir"]) / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def ckpt(summary: dict) -> Path:
    return Path(summary["run_dir"]) / "checkpoints" / f"step_{STEPS:08d}"


def test_two_fsdp_ranks_make_the_single_rank_run(runs, tmp_path):
    tiny, out = runs
    a, b = rows_of(out["local"]), rows_of(out["fsdp2"])
    assert len(a) == len(b) == STEPS
    for ra, rb in zip(a, b, strict=True):
        assert ra["train/reward_mean"] == rb["train/reward_mean"]  # same samples
        # GRPO's loss is a cancelling sum (advantages have zero mean in each group), so it is
        # compared absolutely, at the scale of one token's term (|ratio * advantage| ~ 1).
        assert rb["train/loss"] == pytest.approx(ra["train/loss"], rel=0, abs=1e-6)
        assert rb["train/grad_norm"] == pytest.approx(ra["train/grad_norm"], rel=1e-6)
        assert rb["train/samples"] == ra["train/samples"]
        assert rb["train/pg/kl_ref"] == pytest.approx(ra["train/pg/kl_ref"], rel=1e-5, abs=1e-9)
    assert [r["train/reference/resets"] for r in b] == [0, 1, 1, 2]
    assert b[2]["train/reference/kl_after_reset"] < b[1]["train/reference/kl_before_reset"]
    sharded = ckpt(out["fsdp2"])
    assert {p.name for p in (sharded / "dcp").iterdir()} >= {"__0_0.distcp", "__1_0.distcp"}
    assert not (sharded / "model" / "model.safetensors").exists()
    import torch.distributed.checkpoint as dcp

    keys = list(dcp.FileSystemReader(str(sharded / "dcp")).read_metadata().state_dict_metadata)
    reference = [k for k in keys if k.startswith("extra.reference_reset.")]  # the reset's shards
    assert len(reference) == sum(k.startswith("model.") for k in keys) > 0
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from transformers import AutoModelForCausalLM

    final = Path(out["fsdp2"]["run_dir"]) / FINAL_DIR
    assert out["fsdp2"]["final_model"] == str(final)
    got = AutoModelForCausalLM.from_pretrained(final, local_files_only=True).state_dict()
    dcp_to_torch_save(sharded / "dcp", tmp_path / "full.pt")
    shards = torch.load(tmp_path / "full.pt", weights_only=True)["model"]
    assert set(shards) <= set(got)
    for k, v in shards.items():
        assert torch.equal(got[k], v), k
    want = load_file(str(ckpt(out["local"]) / "model" / "model.safetensors"))
    initial = load_file(str(tiny / "model.safetensors"))
    # Two ranks sum each gradient in another order (float32), and AdamW's normalised step turns
    # that rounding into weight differences: 1.05e-6 relative on q_proj on one machine, under
    # 1e-6 on another; 1e-5 leaves that margin and still fails for any shard that went wrong
    # (a missed or doubled gradient moves a weight by ~lr, 1e-2 relative here).
    for k, w in want.items():
        rel = float((got[k] - w).norm() / w.norm())
        assert rel <= 1e-5, (k, rel)
    assert max(float((want[k] - initial[k]).abs().max()) for k in want) > 1e-3  # it trained


def policy_host_pids(cwd: Path) -> list[int]:
    """Processes hosting a policy rank of the run started in ``cwd``."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes()
            here = Path(os.readlink(proc / "cwd"))
        except OSError:
            continue
        if proc.name.isdigit() and title.startswith(b"ray::PolicyHost") and here == cwd:
            pids.append(int(proc.name))
    return pids


def cli(cwd: Path, opts: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}"}
    cmd = [sys.executable, "-m", "posttrain.entrypoints.grpo", "--config", "arithmetic", "--"]
    return subprocess.Popen([*cmd, *opts], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def step_rows(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timing = ("time/", "perf/")
    return {
        r["step"]: {k: v for k, v in r.items()
                    if not k.startswith(timing) and not k.endswith(("per_s", "_s"))}
        for r in rows
    }  # fmt: skip


def test_kill_9_of_a_rank_then_resume_is_bit_exact(runs, ray_cluster, tmp_path):
    """The module's four FSDP steps straight vs. a CLI run of them whose policy rank 1 is
    SIGKILLed after the step-2 checkpoint and that then resumes: the same metrics and the same
    final shards, bit for bit."""
    tiny, out = runs
    extra = {**FSDP, "placement.ray_address": ray_cluster}
    run_dir = Path("grpo") / "arithmetic_tiny"
    killed_dir = tmp_path / "b"
    killed_dir.mkdir()
    killed = cli(killed_dir, opts_for(killed_dir, tiny, **extra))
    ckpts = killed_dir / run_dir / "checkpoints"
    deadline = time.monotonic() + 240
    while not (ckpts / "step_00000002" / "COMPLETE").exists():
        assert killed.poll() is None, killed.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run never reached its step-2 checkpoint"
        time.sleep(0.05)
    victims = policy_host_pids(killed_dir.resolve())
    assert len(victims) == 2, victims
    os.kill(victims[-1], signal.SIGKILL)
    killed.communicate(timeout=120)
    assert killed.returncode != 0
    assert not (ckpts / "step_00000004").exists()  # it really stopped before the end
    resumed = cli(killed_dir, opts_for(killed_dir, tiny, **extra, **{"rl.resume": "auto"}))
    _, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    a, b = step_rows(Path(out["fsdp2"]["run_dir"])), step_rows(killed_dir / run_dir)
    assert sorted(a) == [1, 2, 3, 4] and {s: b[s] for s in (3, 4)} == {s: a[s] for s in (3, 4)}
    final_a = ckpt(out["fsdp2"])
    final_b = ckpts / "step_00000004"
    ea, eb = export_hf(final_a, tmp_path / "ea"), export_hf(final_b, tmp_path / "eb")
    for f in sorted(ea.glob("*.safetensors")):
        fa, fb = load_file(str(f)), load_file(str(eb / f.name))
        assert fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa), f.name
    for name in ("dcp/__0_0.distcp", "dcp/__1_0.distcp", "trainer.pt"):
        assert (final_a / name).read_bytes() == (final_b / name).read_bytes(), name
