"""The bf16 benchmarks in smoke mode: the bf16-vs-float32 step (benchmarks/memory_profile.py
--dtype) and one update in three precisions (benchmarks/bf16_update.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_smoke_profiles_both_dtypes_and_compares_them(tmp_path, monkeypatch, capsys):
    import memory_profile

    monkeypatch.chdir(tmp_path)  # the tiny model is built under outputs/
    runs = {}
    for dtype in ("float32", "bfloat16"):
        out = tmp_path / f"{dtype}.json"
        assert memory_profile.main(["--smoke", "--dtype", dtype, "--json", str(out)]) == 0
        runs[dtype] = json.loads(out.read_text())
        assert runs[dtype]["overrides"][:2] == [f"model.dtype={dtype}", f"rollout.dtype={dtype}"]
        assert runs[dtype]["threads"] == 1 and len(runs[dtype]["train_tokens"]) == 2
    f32, bf16 = runs["float32"], runs["bfloat16"]
    assert bf16["kv_cache"] * 2 == f32["kv_cache"]  # the bf16 rollout's cache is half the size
    capsys.readouterr()
    paths = [str(tmp_path / "float32.json"), str(tmp_path / "bfloat16.json")]
    assert memory_profile.main(["--compare", *paths]) == 0
    text = capsys.readouterr().out
    for row in ("| step s |", "| update s / 1k tokens |", "| peak RSS MB |"):
        assert row in text, row


def test_rollout_dtype_can_stay_float32_under_a_bf16_policy(tmp_path, monkeypatch):
    import memory_profile

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "p.json"
    argv = ["--smoke", "--dtype", "bfloat16", "--rollout-dtype", "float32", "--json", str(out)]
    assert memory_profile.main(argv) == 0
    assert json.loads(out.read_text())["overrides"][:2] == [
        "model.dtype=bfloat16", "rollout.dtype=float32"
    ]  # fmt: skip


def test_the_bf16_update_benchmark_runs_the_three_settings_on_one_batch():
    """benchmarks/bf16_update.py on the tiny arith workload: the two bf16 updates agree."""
    import subprocess

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bf16_update.py"
    argv = [sys.executable, str(script), "--workload", "arith", "--rounds", "1"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert "float32 / bf16 cast once:" in out
    assert "the two bf16 updates bit for bit equal: True" in out
