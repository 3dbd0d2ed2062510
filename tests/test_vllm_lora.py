# xdist: vllm unit (tests/conftest.py: the files that start vLLM engines share one worker)
"""A LoRA policy's adapters through vLLM's LoRA path (``vllm.lora_sync=adapter``).

One engine with LoRA enabled serves the module (float32, eager; the tiny head-32 Llama of
``test_vllm_engine.py``). Checked: after an adapter-only sync every sampled token's log-prob is
the adapted policy's (the trainer's own forward) within the float32 bound, and far from the
base's; a second version replaces the first (vLLM keeps the first adapter it saw under an id:
each version gets a new one), a 140-token prompt included (the prefix cache); a sync back to the
first adapters gives that version's samples bit for bit; only the live version's folder is kept;
a sync that misses an adapter, or sends full weights, is one line. A LoRA GRPO run with the
engine sends adapters alone after every update, and after a kill -9 (its vLLM processes end
with it) resumes from its last checkpoint to the uninterrupted run's metrics and adapters, bit
for bit.
"""

from __future__ import annotations

import dataclasses
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
from test_entry_grpo import train
from test_vllm_engine import (
    LOGPROB_BOUND,
    LONG,
    OPTIONS,
    PROMPTS,
    _live_in_group,
    build_model_dir,
    vllm_processes,
)

from posttrain.data.logprobs import response_logprobs
from posttrain.model.loading import load_policy
from posttrain.model.lora import apply_lora
from posttrain.placement.weight_sync import WeightSink, WeightSource
from posttrain.rollout.vllm_engine import VllmRolloutEngine
from posttrain.rollout.vllm_process import missing_vllm_message, vllm_python

RANK, ALPHA, TARGETS = 4, 8.0, ("q_proj", "v_proj", "down_proj")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    if vllm_python() is None:
        if os.environ.get("CI"):
            pytest.fail(missing_vllm_message())
        pytest.skip(missing_vllm_message())
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("vllm-lora") / "base", seed=0)


@pytest.fixture(scope="module")
def engine(folder):
    model, tokenizer = load_policy(folder)
    options = dataclasses.replace(OPTIONS, lora_rank=RANK, lora_alpha=ALPHA, lora_targets=TARGETS)
    relative = os.path.relpath(folder)  # resolved before vLLM's process (another cwd) sees it
    e = VllmRolloutEngine(model, tokenizer, weights_from=relative, options=options)
    yield e
    e.close()


def _policy(folder: Path, seed: int):
    """The base with rank-4 adapters whose B is drawn from ``seed`` (far from zero)."""
    policy = apply_lora(load_policy(folder)[0], RANK, ALPHA, list(TARGETS))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)) * 0.3)
    return policy


def _sync(engine: VllmRolloutEngine, policy) -> None:
    source = WeightSource(policy, limit=8 * 1024)  # adapters alone, several buckets
    assert source.adapters and len(source.buckets) > 1
    sink = WeightSink(engine)
    for k in range(len(source.buckets)):
        sink.receive(source.bucket(k), k == len(source.buckets) - 1)


def _gap(model, out) -> float:
    with torch.no_grad():
        trainer = response_logprobs(model, out.batch, temperature=0.7)
    return float((trainer - out.batch.rollout_logprobs).abs()[out.batch.response_mask].max())


def test_adapter_versions_sample_the_adapted_policy_and_a_sync_back_repeats_bit_for_bit(
    engine, folder
):
    base = load_policy(folder)[0]
    one, two = _policy(folder, 7), _policy(folder, 8)
    prompts = [*PROMPTS, LONG]
    outs = []
    for policy in (one, two):
        version = engine.weight_version
        _sync(engine, policy)
        assert engine.weight_version == version + 1 and engine.lora is not None
        out = engine.generate(prompts, n=2, temperature=0.7, max_tokens=16, seed=3)
        print(f"adapter v{engine.weight_version}: gap {_gap(policy, out):.2e}")
        assert _gap(policy, out) <= LOGPROB_BOUND  # this version's adapters, no other's
        assert _gap(base, out) > 100 * LOGPROB_BOUND
        outs.append(out)
    assert _gap(one, outs[1]) > 100 * LOGPROB_BOUND  # the second version replaced the first
    _sync(engine, one)
    again = engine.generate(prompts, n=2, temperature=0.7, max_tokens=16, seed=3)
    assert torch.equal(again.batch.input_ids, outs[0].batch.input_ids)
    assert torch.equal(again.batch.rollout_logprobs, outs[0].batch.rollout_logprobs)
    kept = sorted(p.name for p in Path(engine.process.workdir).glob("lora-*"))
    assert kept == [Path(engine.lora[2]).name]  # earlier versions' folders are gone


def test_a_sync_missing_an_adapter_or_sending_full_weights_is_one_line(engine, folder):
    policy = _policy(folder, 7)
    bucket = WeightSource(policy, limit=1 << 30).bucket(0)
    first = next(k for k in bucket if k.endswith(".lora_A"))
    module = first.removesuffix(".lora_A")
    partial = {k: v for k, v in bucket.items() if not k.startswith(module + ".")}
    with pytest.raises(ValueError, match=r"^weight sync: 1 weight\(s\) did not arrive \(first: "):
        WeightSink(engine).receive(partial, True)
    receiver = engine.weight_receiver()
    receiver.begin()
    with pytest.raises(ValueError, match=r"is not an adapter of this engine's LoRA modules"):
        receiver.load({"model.norm.weight": load_policy(folder)[0].model.norm.weight})
    receiver.begin()
    receiver.load({k: v for k, v in bucket.items() if not k.startswith(module + ".")})
    with pytest.raises(ValueError, match=r"^weight sync: 2 adapter\(s\) did not arrive"):
        receiver.end()


def _launch(opts: list[str]) -> subprocess.Popen:
    """``posttrain grpo`` in a child process, on this checkout's sources."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    command = [sys.executable, "-m", "posttrain.entrypoints.grpo", "--config", "arithmetic", "--"]
    return subprocess.Popen(
        [*command, *opts], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _rows(run_dir: Path) -> dict[int, dict]:
    """Each step's metrics, timings and throughputs left out (they differ between any two
    runs)."""
    out: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").open():
        row = {k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}
        out.setdefault(row["step"], {}).update(row)
    return out


def test_a_lora_grpo_run_sends_adapters_alone_and_resumes_bit_for_bit_after_kill_9(
    tmp_path, folder
):
    """A LoRA GRPO run with vLLM and ``vllm.lora_sync=adapter``, killed (SIGKILL) once step 2 is
    saved, its vLLM processes ending with it, then resumed: every step's metrics and the final
    adapters equal an uninterrupted run's bit for bit (the resumed run's fresh engine samples
    the same rows: per-request seeds, float32), every sync carries the adapters' bytes alone,
    and the sampler gap stays within the bound."""

    def opts(name: str) -> list[str]:
        return [
            f"job.output_root={tmp_path / 'out'}", f"job.name={name}",
            f"model.name_or_path={folder}", "rollout.engine=vllm", "rollout.dtype=float32",
            "rl.grpo_surrogate=clipped", "data.train_size=40", "data.val_size=4",
            "data.prompts_per_step=4", "rollout.n=4", "rollout.max_tokens=4", "rl.max_steps=4",
            "rl.save_every=2", "rl.eval_every=4", "rl.micro_batch_size=8",
            "logging.progress=false", f"model.lora_rank={RANK}", f"model.lora_alpha={ALPHA}",
            "model.lora_target_modules=[q_proj,v_proj]", "rl.lr=0.01",
            "rl.entropy_coef=0.1",  # a gradient whatever the rewards (all 0 for a random model)
            "vllm.lora_sync=adapter",
        ]  # fmt: skip

    train(opts("straight"))  # in this process: the kill and the resume are the processes tested
    run_dir = tmp_path / "out" / "grpo" / "killed"
    killed = _launch(opts("killed"))
    deadline = time.monotonic() + 600
    saved = run_dir / "checkpoints" / "step_00000002" / "COMPLETE"
    while not saved.exists():
        assert killed.poll() is None, killed.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the run never saved step 2"
        time.sleep(0.05)
    workers = vllm_processes(killed.pid)
    assert workers  # the driver's vLLM process, about to lose its driver
    workers |= {p for w in workers for p in _live_in_group(w)}  # and its engine core
    os.kill(killed.pid, signal.SIGKILL)
    killed.communicate()
    gone = time.monotonic() + 60
    while any(_alive(p) for p in workers) and time.monotonic() < gone:
        time.sleep(0.2)
    assert not any(_alive(p) for p in workers), "vLLM outlived its killed driver"
    assert not (run_dir / "checkpoints" / "step_00000004").exists(), "killed after the end"
    resumed = _launch(opts("killed"))
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    assert "resum" in err.lower()
    a, b = _rows(tmp_path / "out" / "grpo" / "straight"), _rows(run_dir)
    assert sorted(a) == sorted(b) == [0, 1, 2, 3, 4]
    assert a == b  # losses, rewards, the sampler gap, sync bytes: every step
    final = Path("checkpoints") / "step_00000004" / "model" / "adapter_model.safetensors"
    one, two = (load_file(str(d / final)) for d in (tmp_path / "out/grpo/straight", run_dir))
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    policy = apply_lora(load_policy(folder)[0], RANK, ALPHA, ["q_proj", "v_proj"])
    adapters = sum(p.numel() * 4 for n, p in policy.named_parameters() if "lora_" in n)
    steps = [b[s] for s in (1, 2, 3, 4)]
    assert all(r["sync/bytes"] == adapters for r in steps)
    worst = [r["train/rollout/logprob_abs_diff_max"] for r in steps]
    print(f"LoRA GRPO with vLLM adapters, killed at 2 and resumed: gap max {worst}")
    assert all(0 <= w <= LOGPROB_BOUND for w in worst)
    assert "val/accuracy" in b[4] and (run_dir / "final_model").is_dir()


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
