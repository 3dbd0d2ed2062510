"""Rollout tokens/s of vLLM's CPU build vs posttrain's torch engine, and one full weight sync.

    python benchmarks/vllm_bench.py                     # the ``small`` preset's shape
    python benchmarks/vllm_bench.py --shape smollm2     # SmolLM2-135M's shape (random weights)
    python benchmarks/vllm_bench.py --dtype bfloat16    # both engines sample in bf16
    python benchmarks/vllm_bench.py --shape smollm2 --lora 16   # a LoRA policy's merged sync
    python benchmarks/vllm_bench.py --shape smollm2 --lora 16 --lora-sync adapter  # adapters
    python benchmarks/vllm_bench.py --json vllm.json

Random weights of a Llama shape (``small``: hidden 512, 8 layers, 8 heads of 64, vocab 99,
25M parameters; ``smollm2``: SmolLM2-135M's, hidden 576, 30 layers, 9/3 heads of 64, vocab
49152), in ``--dtype`` (float32 by default; the torch engine samples with a copy in that dtype),
the same prompts and sampling for both engines, stop tokens off so every row
runs to ``--new`` tokens. Each engine's rollout is timed after one warm-up call (median of
``--repeats``). vLLM runs eager with ``--kv-gib`` of KV space (``rollout.engine=vllm``'s
defaults); its load (process start to first reply) is reported apart. The sync is what a run
does after every update: every weight through ``WeightSource`` buckets of
``placement.sync_bucket_mb``'s default into the engine's receiver (safetensors in /dev/shm,
``reload_weights``, ``lm_head`` repack, prefix-cache reset); ``--lora R``: the policy is that
model with rank-``R`` adapters on every linear layer (``B`` nonzero), and the sync sends its
merged weights (``base + B @ A * scale``, ``vllm.lora_sync=merged``), with the adapters' own
bytes beside them and the driver's peak RSS growth over the syncs; ``--lora-sync adapter``
sends the adapters alone into vLLM's LoRA path (``vllm.lora_sync=adapter``: each sync a new
adapter version), and vLLM's rollout is then timed with the adapter loaded (its LoRA matmuls
included; the merged engine samples a plain model). Needs ``.venv-vllm``
(``make install-vllm``). Numbers depend on what else runs: alone on the machine they time.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

#: Every linear layer of a Llama block.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHAPES = {
    "small": dict(hidden=512, layers=8, heads=8, kv=8, ffn=1376, vocab=99),
    "smollm2": dict(hidden=576, layers=30, heads=9, kv=3, ffn=1536, vocab=49152),
}


def _rss_kib(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (the peak so far) of this process, KiB."""
    text = Path("/proc/self/status").read_text()
    return int(next(line for line in text.splitlines() if line.startswith(field)).split()[1])


def lora_policy(model, rank: int):
    """``model`` (a deep copy) with rank-``rank`` adapters on every linear layer, ``B`` random
    (a policy some updates away from its base)."""
    from posttrain.model.lora import apply_lora

    policy = apply_lora(copy.deepcopy(model), rank, 2.0 * rank, list(TARGETS))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.01)
    return policy


def build_model(shape: dict, folder: Path):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=shape["vocab"], hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv"],
        intermediate_size=shape["ffn"], max_position_embeddings=1024, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(folder, safe_serialization=True)
    return model


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    from posttrain.model.lora import adapter_bytes
    from posttrain.placement.weight_sync import WeightSink, WeightSource, bucket_bytes
    from posttrain.rollout.registry import build_engine
    from posttrain.rollout.vllm_engine import VllmOptions

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the torch engine")
    ap.add_argument("--kv-gib", type=float, default=1.0)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--sync-mb", type=float, default=256.0, help="bucket size of the sync")
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank of the synced policy")
    ap.add_argument("--lora-sync", choices=("merged", "adapter"), default="merged")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shape = SHAPES[args.shape]
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, shape["vocab"], (args.prompts, args.prompt_len), generator=g)
    prompts = prompts.tolist()
    tokens = args.prompts * args.n * args.new
    kw = dict(n=args.n, temperature=1.0, max_tokens=args.new, seed=0)
    out: dict[str, object] = {"shape": args.shape, "tokens_per_call": tokens, **vars(args)}
    out.pop("json")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        model = build_model(shape, folder)
        out["parameters"] = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
        sampler = model if args.dtype == "float32" else copy.deepcopy(model).to(torch.bfloat16)
        torch_engine = build_engine("torch", sampler, stop_token_ids=[], pad_token_id=0)
        seconds = timed(lambda: torch_engine.generate(prompts, **kw), args.repeats)
        out["torch_tok_s"] = tokens / seconds
        adapters = bool(args.lora) and args.lora_sync == "adapter"
        options = VllmOptions(dtype=args.dtype, kv_cache_space_gib=args.kv_gib)
        if adapters:
            options = dataclasses.replace(
                options, lora_rank=args.lora, lora_alpha=2.0 * args.lora, lora_targets=TARGETS
            )
        t0 = time.perf_counter()
        engine = build_engine(
            "vllm", model, None, stop_token_ids=[], pad_token_id=0, weights_from=folder,
            options=options,
        )  # fmt: skip
        out["vllm_load_s"] = time.perf_counter() - t0
        try:
            policy = lora_policy(model, args.lora) if args.lora else model
            source = WeightSource(policy, bucket_bytes(args.sync_mb), adapters=adapters)
            sink = WeightSink(engine)
            if adapters:  # sample with the adapter loaded
                for k in range(len(source.buckets)):
                    sink.receive(source.bucket(k), k == len(source.buckets) - 1)
            seconds = timed(lambda: engine.generate(prompts, **kw), args.repeats)
            out["vllm_tok_s"] = tokens / seconds
            if args.lora:
                out["adapter_mib"] = adapter_bytes(policy) / 2**20
            rss_before = _rss_kib("VmRSS")
            syncs = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                for k in range(len(source.buckets)):
                    sink.receive(source.bucket(k), k == len(source.buckets) - 1)
                syncs.append(time.perf_counter() - t0)
            out["sync_s"] = statistics.median(syncs)
            out["sync_reload_s"] = engine.last_reload_s
            out["sync_buckets"] = len(source.buckets)
            out["sync_mib"] = sum(u.nbytes for b in source.buckets for u in b) / 2**20
            out["sync_peak_rss_growth_mib"] = (_rss_kib("VmHWM") - rss_before) / 1024
        finally:
            engine.close()
    out["vllm_over_torch"] = out["vllm_tok_s"] / out["torch_tok_s"]
    for key, value in out.items():
        print(f"{key:>18}: {value:.3f}" if isinstance(value, float) else f"{key:>18}: {value}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
