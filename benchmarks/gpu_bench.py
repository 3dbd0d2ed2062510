"""Single-device throughput: rollout, one training update, and a full GRPO step's phases.

    python benchmarks/gpu_bench.py --json gpu.json     # on one GPU, a few minutes
    python benchmarks/gpu_bench.py --engine vllm --shape qwen2.5-0.5b --json vllm.json  # GPU
    python benchmarks/gpu_bench.py --smoke             # CPU, tiny sizes, seconds (CI runs it)
    python benchmarks/gpu_bench.py --smoke --engine vllm   # CPU, vLLM's CPU build, minutes

Model (random weights, ``--shape``): ``smollm2`` (the default), a Llama of SmolLM2-135M's shape
(hidden 576, 30 layers, 9/3 heads of 64, ffn 1536, vocab 49152); ``qwen2.5-0.5b``, a Qwen2 of
Qwen2.5-0.5B's (hidden 896, 24 layers, 14/2 heads of 64, ffn 4864, vocab 151936, tied
embeddings, 494M parameters). Rollout: 64 prompts x 8 samples, 64-token prompts, 256 new
tokens, in ``--dtype`` (bf16), posttrain's engines (``torch``; ``static``: CUDA graphs) vs HF
``generate`` (same model, same shapes, stop tokens off so every row runs to the budget).
Update: 512 rows x 320 tokens, micro-batch 64 (32 for ``qwen2.5-0.5b``), bf16 autocast over
float32 master weights, with and without ``model.compile``; MFU is
6 * parameters * tokens / time / ``--peak-tflops``. GRPO step: ``posttrain grpo`` on the
``small`` preset (25M, 8 heads of 64) whatever ``--shape`` (phase times from its metrics;
``--skip-grpo`` leaves it out). Prints a table and writes JSON.

``--engine vllm`` also times ``rollout.engine=vllm`` (``VllmRolloutEngine``) on the same model
(written with ``save_pretrained`` to a temporary folder, in the bench's dtype) and prompts, stop
tokens off: ``vllm_rollout_tok_s``, ``vllm_load_s`` (process start to ready) and
``vllm_vs_torch`` (its tokens/s over posttrain's torch engine's), and the GRPO step runs with
``rollout.engine=vllm`` (``rollout.dtype``, ``vllm.kv_cache_space_gib``, ``vllm.enforce_eager``
as the rollout's). ``--kv-cache-gib``: vLLM's KV space (1 with ``--smoke``, else 16: the
rollout's 512 rows x 320 tokens need 3.5 GiB in bf16 on ``smollm2``, 1.9 on ``qwen2.5-0.5b``).
``--vllm-eager auto``: eager with ``--smoke`` (the CPU build compiles for minutes), compiled
with CUDA graphs on a GPU. vLLM is timed first and closed before the torch engines run, and
the driver empties its CUDA cache before the GRPO step: a vLLM GPU build refuses to start
unless its ``gpu_memory_utilization`` (``vllm.gpu_memory_utilization``, 0.3) of the GPU
is free. No vLLM process outlives the
bench. vLLM runs in its own interpreter (``$POSTTRAIN_VLLM_PYTHON``, else ``.venv-vllm``);
without one ``--engine vllm`` stops with one line (exit status 1). The GPU device machine has
no network and no vLLM: there a CUDA build of vLLM must be provided and named by
``POSTTRAIN_VLLM_PYTHON`` (``.venv-vllm`` is the CPU build).

``--smoke --engine vllm``: vLLM's CPU attention takes head sizes 32, 64, ... (not the smoke
model's 8), so that smoke model has 2 heads of 32 (hidden 64) and its GRPO step the
``arith_h32`` preset (one head of 32) instead of ``tiny`` (heads of 12).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

SHAPES = {
    "smollm2": dict(arch="llama", hidden=576, layers=30, heads=9, kv=3, ffn=1536, vocab=49152),
    "qwen2.5-0.5b": dict(arch="qwen2", hidden=896, layers=24, heads=14, kv=2, ffn=4864,
                         vocab=151936, micro=32),
}  # fmt: skip
WORKLOAD = dict(prompts=64, n=8, prompt_len=64, new=256, rows=512, seq=320, micro=64,
                preset="small", steps=4, grpo=(8, 8, 32))  # fmt: skip
#: The default sizes (``--shape smollm2``).
FULL = {**WORKLOAD, **SHAPES["smollm2"]}
SMOKE = dict(arch="llama", hidden=32, layers=2, heads=4, kv=2, ffn=64, vocab=128, prompts=2, n=2,
             prompt_len=6, new=5, rows=8, seq=12, micro=4, preset="tiny", steps=2,
             grpo=(2, 2, 4))  # fmt: skip
#: ``--smoke --engine vllm``: head sizes vLLM's CPU attention takes (32), also for the GRPO step.
SMOKE_VLLM = dict(hidden=64, heads=2, kv=2, ffn=128, preset="arith_h32")


def sizes(args: argparse.Namespace) -> dict:
    """The model's shape and the workload for ``--smoke``, ``--shape`` and ``--engine``."""
    if not args.smoke:
        return {**WORKLOAD, **SHAPES[args.shape]}
    s = {**SMOKE, "arch": SHAPES[args.shape]["arch"]}
    return {**s, **SMOKE_VLLM} if args.engine == "vllm" else s


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def build_model(s: dict, dtype: torch.dtype, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
        intermediate_size=s["ffn"], max_position_embeddings=1024, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    if s.get("arch", "llama") == "qwen2":  # Qwen2.5's RoPE base and norm epsilon
        rope = {"rope_type": "default", "rope_theta": 1e6}
        cls, cfg = Qwen2ForCausalLM, Qwen2Config(**common, rope_parameters=rope, rms_norm_eps=1e-6)
    else:
        cls, cfg = LlamaForCausalLM, LlamaConfig(**common)
    torch.manual_seed(0)
    return cls(cfg).to(device=device, dtype=dtype).eval()


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


def free_cuda() -> None:
    """Give the driver's cached CUDA blocks back (a vLLM GPU build checks free memory at start)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def bench_vllm(model, s: dict, prompts: list, options, workdir: Path, repeats: int) -> dict:
    """``rollout.engine=vllm`` on ``model``'s weights (saved to ``workdir``), closed at the end."""
    from posttrain.rollout.vllm_engine import VllmRolloutEngine

    folder = workdir / "vllm-model"
    model.save_pretrained(folder, safe_serialization=True)
    t0 = time.perf_counter()
    engine = VllmRolloutEngine(
        model, stop_token_ids=[], pad_token_id=0, weights_from=folder, options=options
    )
    load = time.perf_counter() - t0
    try:  # vLLM samples in its own process: the driver's clock is the measure
        seconds = timed(
            lambda: engine.generate(prompts, n=s["n"], max_tokens=s["new"], seed=0),
            torch.device("cpu"), repeats,
        )  # fmt: skip
    finally:
        engine.close()
    return {"vllm_rollout_tok_s": s["prompts"] * s["n"] * s["new"] / seconds, "vllm_load_s": load}


def bench_rollout(
    s: dict, dtype: torch.dtype, device: torch.device, repeats: int, vllm=None, workdir=None
) -> dict:
    from posttrain.rollout.registry import build_engine

    model = build_model(s, dtype, torch.device("cpu"))
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, s["vocab"], (s["prompts"], s["prompt_len"]), generator=g)
    out = {} if vllm is None else bench_vllm(model, s, prompts.tolist(), vllm, workdir, repeats)
    model = model.to(device)
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
    out.update({
        "rollout_tok_s": tokens / ours, "rollout_ms_per_decode_step": 1e3 * ours / s["new"],
        "static_rollout_tok_s": tokens / graphed,
        "static_rollout_ms_per_decode_step": 1e3 * graphed / s["new"],
        "hf_generate_tok_s": tokens / theirs, "hf_ms_per_decode_step": 1e3 * theirs / s["new"],
    })  # fmt: skip
    if vllm is not None:
        out["vllm_vs_torch"] = out["vllm_rollout_tok_s"] / out["rollout_tok_s"]
    return out


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


def grpo_opts(s: dict, device: torch.device, workdir: Path, vllm=None) -> list[str]:
    """The GRPO step's overrides of the ``arithmetic_clipped`` recipe."""
    opts = [
        f"job.output_root={workdir}", f"model.name_or_path={workdir / s['preset']}",
        f"model.init_preset={s['preset']}", f"rl.max_steps={s['steps']}", "rl.save_every=0",
        "rl.eval_every=0", "rl.resume=off", "logging.progress=false",
        f"placement.device={device}", f"data.prompts_per_step={s['grpo'][0]}",
        f"rollout.n={s['grpo'][1]}", f"rollout.max_tokens={s['grpo'][2]}",
        "rl.micro_batch_size=64",
    ]  # fmt: skip
    if vllm is not None:
        opts += [
            "rollout.engine=vllm", f"rollout.dtype={vllm.dtype}",
            f"vllm.kv_cache_space_gib={vllm.kv_cache_space_gib}",
            f"vllm.enforce_eager={str(vllm.enforce_eager).lower()}",
        ]  # fmt: skip
    return opts


def bench_grpo_step(s: dict, device: torch.device, workdir: Path, vllm=None) -> dict:
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.entrypoints import grpo

    opts = grpo_opts(s, device, workdir, vllm)
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


def vllm_options(args: argparse.Namespace, dtype: torch.dtype, device: torch.device):
    """The rollout's and the GRPO step's vLLM settings; exits in one line without vLLM."""
    from posttrain.rollout.vllm_engine import VllmOptions
    from posttrain.rollout.vllm_process import missing_vllm_message, vllm_python

    if vllm_python() is None:
        raise SystemExit(missing_vllm_message())  # the line on stderr, exit status 1
    eager = args.smoke if args.vllm_eager == "auto" else args.vllm_eager == "on"
    kv = args.kv_cache_gib if args.kv_cache_gib is not None else 1.0 if args.smoke else 16.0
    name = str(dtype).removeprefix("torch.")
    # the device: on CUDA a vLLM CPU build is refused in one line (it would time the CPU)
    return VllmOptions(dtype=name, kv_cache_space_gib=kv, enforce_eager=eager, device=str(device))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (CI)")
    ap.add_argument("--engine", default="torch", choices=["torch", "vllm"],
                    help="vllm: also time rollout.engine=vllm and run the GRPO step with it")  # fmt: skip
    ap.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--peak-tflops", type=float, default=773.0, help="H200 dense bf16")
    ap.add_argument("--compile", action="store_true", help="also time the update compiled")
    ap.add_argument("--kv-cache-gib", type=float, default=None,
                    help="vLLM's KV space (default: 1 with --smoke, else 16)")  # fmt: skip
    ap.add_argument("--vllm-eager", default="auto", choices=["auto", "on", "off"],
                    help="vLLM's enforce_eager (auto: on with --smoke, off on a GPU)")  # fmt: skip
    ap.add_argument("--skip-grpo", action="store_true", help="rollout and update only")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from posttrain.placement.errors import RoleFailedError
    from posttrain.run.records import quiet_libraries

    s = sizes(args)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else getattr(torch, args.dtype)
    vllm = vllm_options(args, dtype, device) if args.engine == "vllm" else None
    quiet_libraries()
    result: dict = {"device": str(device), "sizes": s, "dtype": str(dtype)}
    result.update(engine=args.engine, shape=args.shape)

    def phase(part: dict) -> None:
        """Keep a finished phase: printed and written at once, so a run cut short by a time
        limit (a lent GPU's 10-minute command) still leaves what it measured."""
        result.update(part)
        for k, v in part.items():
            if isinstance(v, float):
                print(f"{k:<34}{v:>14.4g}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))

    print(f"{'metric':<34}{'value':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        repeats = 1 if args.smoke else 3
        try:
            phase(bench_rollout(s, dtype, device, repeats, vllm, Path(tmp)))
        except RoleFailedError as e:  # vLLM refused or died: its one line
            raise SystemExit(str(e)) from None
        free_cuda()
        phase(bench_update(s, device, compile=False, peak_tflops=args.peak_tflops))
        if args.compile:
            free_cuda()
            compiled = bench_update(s, device, compile=True, peak_tflops=args.peak_tflops)
            phase({f"compiled_{k}": v for k, v in compiled.items()})
        if not args.skip_grpo:
            free_cuda()
            phase(bench_grpo_step(s, device, Path(tmp), vllm))
    return result


if __name__ == "__main__":
    main()
