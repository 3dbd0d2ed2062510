# xdist: vllm unit (tests/conftest.py: the files that start vLLM engines share one worker)
"""``benchmarks/gpu_bench.py --smoke --engine vllm`` on vLLM's CPU build (``.venv-vllm``).

One engine start (``--skip-grpo``: the GRPO step with ``rollout.engine=vllm`` would start a
second; its settings are checked without a start in ``test_gpu_bench.py``). Skipped without
vLLM's environment outside CI, a failure in CI (``test_vllm_engine._need_vllm``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
from test_vllm_engine import _live_in_group, _need_vllm, vllm_processes

from posttrain.rollout.vllm_engine import VllmRolloutEngine

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


def test_smoke_with_vllm_times_its_rollout_and_leaves_no_vllm_process(
    tmp_path, capsys, monkeypatch
):
    import gpu_bench

    _need_vllm()
    groups: list[int] = []  # each closed engine's process group (its worker leads one)
    close = VllmRolloutEngine.close

    def recorded_close(self):
        groups.append(self.process.proc.pid)
        close(self)

    monkeypatch.setattr(VllmRolloutEngine, "close", recorded_close)
    before = vllm_processes(os.getpid())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path / "bench.json"
        result = gpu_bench.main(["--smoke", "--engine", "vllm", "--skip-grpo", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    for key in ("vllm_rollout_tok_s", "vllm_load_s", "vllm_vs_torch", "rollout_tok_s"):
        assert result[key] > 0, key
    assert result["vllm_vs_torch"] == result["vllm_rollout_tok_s"] / result["rollout_tok_s"]
    assert result["sizes"]["hidden"] // result["sizes"]["heads"] == 32
    assert "grpo_step_s" not in result and "vllm_rollout_tok_s" in capsys.readouterr().out
    assert len(groups) == 1  # the bench closed its engine
    deadline = time.monotonic() + 30
    while _live_in_group(groups[0]):  # the worker and vLLM's engine core, SIGKILLed at close
        assert time.monotonic() < deadline, "a vLLM process outlived the bench"
        time.sleep(0.2)
    assert vllm_processes(os.getpid()) == before
