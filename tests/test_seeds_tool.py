"""benchmarks/seeds.py: two seeds x three steps of the tiny arithmetic recipe, each its own
``posttrain grpo`` subprocess with its own initial model; the table; a second call skips both
(complete) and reads the same numbers from their metrics.jsonl."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import seeds  # noqa: E402


def overrides(root: Path) -> list[str]:
    return [
        "--", f"job.output_root={root}", f"model.name_or_path={root}/models/tiny",
        "data.train_size=20", "data.val_size=4", "data.prompts_per_step=2", "rollout.n=2",
        "rollout.max_tokens=4", "rl.max_steps=3", "rl.eval_every=3", "rl.save_every=3",
        "rl.micro_batch_size=4", "logging.progress=false",
    ]  # fmt: skip


def test_two_seeds_run_tabulate_and_a_second_call_skips_them(tmp_path, capsys):
    argv = [
        "arithmetic",
        "--seeds",
        "0",
        "1",
        "--target",
        "0",
        "--name",
        "sw",
        "--hold",
        "2",
        *overrides(tmp_path),
    ]
    assert seeds.main(argv) == 0
    first = capsys.readouterr().out.splitlines()
    runs = [tmp_path / "grpo" / f"sw_seed{k}" for k in (0, 1)]
    assert all((r / "checkpoints" / "step_00000003" / "COMPLETE").is_file() for r in runs)
    assert (tmp_path / "models" / "tiny_seed0").is_dir() and (
        tmp_path / "models" / "tiny_seed1"
    ).is_dir()
    assert first[0].split()[:2] == ["seed", "step"] and first[0].endswith("status")
    assert first[0].split()[3:5] == ["held", "x2"]
    for line, k in zip(first[1:3], (0, 1), strict=True):
        cells = line.split()
        assert cells[0] == str(k) and cells[1] == "0" and cells[4] == "3" and cells[-1] == "ran"
        assert cells[2] == "0"  # held for two evaluations (steps 0 and 3) from step 0
        float(cells[3])  # the final held-out accuracy, at step 3
    assert first[3].split()[:3] == ["median", "0", "0"] and first[4].split()[0] == "worst"
    assert first[5] == "2 of 2 seeds reached val/accuracy >= 0"
    stamps = [(r / "metrics.jsonl").stat().st_mtime_ns for r in runs]
    assert seeds.main(argv) == 0
    second = capsys.readouterr().out.splitlines()
    assert [line.split()[:5] for line in second[1:3]] == [line.split()[:5] for line in first[1:3]]
    assert all(line.endswith("skipped (complete)") for line in second[1:3])
    assert [(r / "metrics.jsonl").stat().st_mtime_ns for r in runs] == stamps


def test_a_repeated_seed_and_a_bad_override_are_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"^seeds: --seeds \[1, 1\] repeats a seed"):
        seeds.main(["arithmetic", "--seeds", "1", "1"])
    with pytest.raises(SystemExit, match=r"^seeds: --hold 0: give 1 or more evaluations"):
        seeds.main(["arithmetic", "--hold", "0"])
    with pytest.raises(SystemExit) as e:
        seeds.main(["arithmetic", "--", "rl.max_step=3"])
    assert str(e.value).startswith("seeds: ") and "rl.max_steps" in str(e.value)
    assert "\n" not in str(e.value)


def test_avx2_kernels_name_their_runs_and_reach_each_seeds_process(tmp_path, monkeypatch):
    """``--kernels avx2``: the runs are ``BASE_avx2_seedk`` (a native sweep's stay apart), and
    each seed's process gets the libraries' switches; torch then reports AVX2 kernels whatever
    the machine has beyond AVX2."""
    plan = seeds.plan("arithmetic", [0, 2], None, overrides(tmp_path)[1:], "avx2")
    assert [s.run_dir.name for s in plan] == [
        "arithmetic_tiny_avx2_seed0",
        "arithmetic_tiny_avx2_seed2",
    ]
    seen = {}

    def fake_run(cmd, stdout, stderr, env):
        seen.update(env)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(seeds.subprocess, "run", fake_run)
    assert seeds.run_seed(plan[0], "arithmetic", "grpo", tmp_path / "logs") == "ran"
    assert {k: seen[k] for k in seeds.KERNELS["avx2"]} == seeds.KERNELS["avx2"]
    monkeypatch.undo()
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    env = {**os.environ, **seeds.KERNELS["avx2"]}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "AVX2"
