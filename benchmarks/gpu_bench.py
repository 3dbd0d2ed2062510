"""Single-device throughput: rollout, one training update, and a full GRPO step's phases.

    python benchmarks/gpu_bench.py --json gpu.json     # on one GPU, a few minutes
    python benchmarks/gpu_bench.py --smoke             # CPU, tiny sizes, seconds (CI runs it)

Default sizes: a random-weight Llama of SmolLM2-135M's shape (hidden 576, 30 layers, 9/3 heads,
ffn 1536, vocab 49152). Rollout: 64 prompts x 8 samples, 64-token prompts, 256 new tokens, in
``--dtype`` (bf16), posttrain's engines (``torch``; ``static``: CUDA graphs) vs HF ``generate`` (same model, same shapes, stop tokens
off so every row runs to the budget). Update: 512 rows x 320 tokens, micro-batch 64, bf16
autocast over float32 master weights, with and without ``model.compile``; MFU is
6 * parameters * tokens / time / ``--peak-tflops``. GRPO step: ``posttrain grpo`` on the
``small`` preset (phase times from its metrics). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

FULL = dict(hidden=576, layers=30, heads=9, kv=3, ffn=1536, vocab=49152, prompts=64, n=8,
            prompt_len=64, new=256, rows=512, seq=320, micro=64, preset="small", steps=4,
            grpo=(8, 8, 32))  # fmt: skip
SMOKE = dict(hidden=32, layers=2, heads=4, kv=2, ffn=64, vocab=128, prompts=2, n=2,
             prompt_len=6, new=5, rows=8, seq=12, micro=4, preset="tiny", steps=2,
             grpo=(2, 2, 4))  # fmt: skip


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def build_model(s: dict, dtype: torch.dtype, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
        intermediate_size=s["ffn"], max_position_embeddings=1024, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()


def timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up: kernels, allocator, first-shape setup
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_rollout(s: dict, dtype: torch.dtype, device: torch.device, repeats: int) -> dict:
    from posttrain.rollout.registry import build_engine

    model = build_model(s, dtype, device)
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, s["vocab"], (s["prompts"], s["prompt_len"]), generator=g)
    engine = build_engine("torch", model, stop_token_ids=[], pad_token_id=0)
    ours = timed(
        lambda: engine.generate(prompts.tolist(), n=s["n"], max_tokens=s["new"], seed=0),
        device, repeats,
    )  # fmt: skip
    static = build_engine("static", model, stop_token_ids=[], pad_token_id=0)
    graphed = timed(
        lambda: static.generate(prompts.tolist(), n=s["n"], max_tokens=s["new"], seed=0),
        device, repeats,
    )  # fmt: skip
    ids = prompts.to(device).repeat_interleave(s["n"], 0)

    def hf():
        with torch.no_grad():
            model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                max_new_tokens=s["new"], min_new_tokens=s["new"], top_k=0, pad_token_id=0,
            )  # fmt: skip

    theirs = timed(hf, device, repeats)
    tokens = s["prompts"] * s["n"] * s["new"]
    return {
        "rollout_tok_s": tokens / ours, "rollout_ms_per_decode_step": 1e3 * ours / s["new"],
        "static_rollout_tok_s": tokens / graphed,
        "static_rollout_ms_per_decode_step": 1e3 * graphed / s["new"],
        "hf_generate_tok_s": tokens / theirs, "hf_ms_per_decode_step": 1e3 * theirs / s["new"],
    }  # fmt: skip


def bench_update(s: dict, device: torch.device, compile: bool, peak_tflops: float) -> dict:
    from posttrain.algorithm.grpo import make_objective
    from posttrain.config import RLConfig
    from posttrain.model.tiny import count_parameters
    from posttrain.testing import synthetic_batch
    from posttrain.trainer import LLMTrainer

    model = build_model(s, torch.float32, device).train()
    prompt = s["seq"] // 5
    batch = synthetic_batch(
        s["vocab"], s["rows"], prompt_width=prompt, response_width=s["seq"] - prompt, seed=0
    )
    objective = make_objective(RLConfig(), _Context(s["seq"] - prompt))
    precision = "bfloat16" if device.type == "cuda" else "float32"
    trainer = LLMTrainer(
        model, objective, lr=1e-6, micro_batch_size=s["micro"], precision=precision,
        device=device, compile=compile,
    )  # fmt: skip
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = timed(lambda: trainer.train_on_batch(batch), device, 2)
    tokens = int(batch.attention_mask.sum())
    flops = 6 * count_parameters(model) * tokens
    return {
        "update_s": seconds, "train_tok_s": tokens / seconds,
        "mfu": flops / seconds / (peak_tflops * 1e12), "peak_mem_gib": peak_memory_gib(device),
    }  # fmt: skip


class _Context:
    def __init__(self, max_len: int) -> None:
        self.max_response_length = max_len


def bench_grpo_step(s: dict, device: torch.device, workdir: Path) -> dict:
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.entrypoints import grpo

    opts = [
        f"job.output_root={workdir}", f"model.name_or_path={workdir / s['preset']}",
        f"model.init_preset={s['preset']}", f"rl.max_steps={s['steps']}", "rl.save_every=0",
        "rl.eval_every=0", "rl.resume=off", "logging.progress=false",
        f"placement.device={device}", f"data.prompts_per_step={s['grpo'][0]}",
        f"rollout.n={s['grpo'][1]}", f"rollout.max_tokens={s['grpo'][2]}",
        "rl.micro_batch_size=64",
    ]  # fmt: skip
    config = load_config("arithmetic_clipped", ["--", *opts])
    summary = grpo.run(
        config, "arithmetic_clipped", opts, grpo.default_out_dir(config), build_objective
    )
    rows = [
        json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]
    rows = [r for r in rows if r["step"] >= 2] or rows[-1:]
    keys = ("time/rollout_s", "time/reward_s", "time/train_s", "time/sync_s", "time/step_s")
    return {f"grpo_{k.split('/')[1]}": statistics.median(r[k] for r in rows) for k in keys}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (CI)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--peak-tflops", type=float, default=773.0, help="H200 dense bf16")
    ap.add_argument("--compile", action="store_true", help="also time the update compiled")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from posttrain.run.records import quiet_libraries

    quiet_libraries()
    s = SMOKE if args.smoke else FULL
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else getattr(torch, args.dtype)
    result: dict = {"device": str(device), "sizes": s, "dtype": str(dtype)}
    result.update(bench_rollout(s, dtype, device, repeats=1 if args.smoke else 3))
    result.update(bench_update(s, device, compile=False, peak_tflops=args.peak_tflops))
    if args.compile:
        compiled = bench_update(s, device, compile=True, peak_tflops=args.peak_tflops)
        result.update({f"compiled_{k}": v for k, v in compiled.items()})
    with tempfile.TemporaryDirectory() as tmp:
        result.update(bench_grpo_step(s, device, Path(tmp)))
    print(f"{'metric':<34}{'value':>14}")
    for k, v in result.items():
        if isinstance(v, float):
            print(f"{k:<34}{v:>14.4g}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
