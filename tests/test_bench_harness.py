"""The posttrain side of benchmarks/vs_trl.py runs the entry's step and reports its phases."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_posttrain_side_times_each_phase(tmp_path):
    from bench_posttrain import PosttrainSide, Workload

    from posttrain.model.tiny import build_tiny_model

    w = Workload(
        "arith", "arith", prompts=2, n=2, max_tokens=3, kl_beta=0.1, lr=1e-3, micro_batch=4
    )
    model = build_tiny_model("arith", tmp_path / "m", seed=0)
    side = PosttrainSide(w, model, tmp_path / "out", steps=2)
    phases = [side.step(s, side.prompts_for(s)) for s in (1, 2)]
    for p in phases:
        assert {"generate", "reward_fwd", "policy_fwd", "reference_fwd"} - set(p) == {"reward_fwd"}
        assert p["step"] >= p["generate"] + p["policy_fwd"] + p["reference_fwd"] > 0
        assert "pi_old_fwd" not in p  # one update per collected batch: no scoring forward
    assert side.roles.policy.trainer.global_step == 2


def test_tree_rss_adds_a_child_processs_memory():
    """An engine in processes of its own (vLLM) counts in the side's peak: a child holding
    300 MB shows in the sampled tree's peak beside this process's own."""
    import subprocess
    import time

    from bench_posttrain import TreeRss

    hold = "x = bytearray(300 * 2**20); print('ok', flush=True); input()"
    child = subprocess.Popen(
        [sys.executable, "-c", hold], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline() == "ok\n"
    tree = TreeRss(period=0.05)
    try:
        deadline = time.monotonic() + 10
        while tree.peak_bytes < 300 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        tree.stop()
        child.communicate("\n", timeout=10)
    own = int(Path("/proc/self/statm").read_text().split()[1]) * tree._page
    assert tree.peak_bytes >= own + 290 * 2**20
