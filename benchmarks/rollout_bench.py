"""Throughput of the built-in rollout engine on the tiny-model presets.

Every response runs to ``max_tokens`` (no stop tokens), so all rows do the same work and
tokens/s is comparable across runs. Besides tokens/s the table shows how much of the wall time is
spent inside the model's forward (the rest is sampling and bookkeeping in the engine), and, for
reference, transformers' own ``generate`` on the same model and batch.

    python benchmarks/rollout_bench.py                      # tiny + small, 64 prompts x 8
    python benchmarks/rollout_bench.py --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import LlamaForCausalLM

from posttrain.model.tiny import count_parameters, tiny_config
from posttrain.model.tokenizer import build_char_tokenizer
from posttrain.rollout import TorchRolloutEngine

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ForwardTimer:
    """Accumulates wall time spent inside ``model.forward`` (synchronising on CUDA)."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.total = 0.0
        self.calls = 0
        self._start = 0.0
        self._device = device
        self._handles = [
            model.register_forward_pre_hook(self._pre),
            model.register_forward_hook(self._post),
        ]

    def _pre(self, *_):
        _sync(self._device)
        self._start = time.perf_counter()

    def _post(self, *_):
        _sync(self._device)
        self.total += time.perf_counter() - self._start
        self.calls += 1

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def _prompts(tok, count: int) -> list[list[int]]:
    return [tok(f"{i % 97}+{(i * 37) % 89}=")["input_ids"] for i in range(count)]


def bench_preset(preset: str, args, device: torch.device) -> dict:
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_config(preset)).to(device=device, dtype=DTYPES[args.dtype]).eval()
    prompts = _prompts(tok, args.prompts)
    max_tokens = args.max_tokens or (128 if preset == "tiny" else 64)
    engine = TorchRolloutEngine(model, tok, stop_token_ids=[])
    engine.generate(prompts[:2], n=2, max_tokens=4, seed=0)  # warm-up (allocator, kernels)
    timer = ForwardTimer(model, device)
    _sync(device)
    t0 = time.perf_counter()
    r = engine.generate(prompts, n=args.n, max_tokens=max_tokens, seed=0)
    _sync(device)
    wall = time.perf_counter() - t0
    timer.remove()
    tokens = int(r.response_lengths.sum())
    row = {
        "preset": preset,
        "parameters": count_parameters(model),
        "device": str(device),
        "dtype": args.dtype,
        "threads": torch.get_num_threads(),
        "rows": len(prompts) * args.n,
        "max_tokens": max_tokens,
        "tokens": tokens,
        "seconds": round(wall, 4),
        "tokens_per_s": round(tokens / wall, 1),
        "ms_per_step": round(wall / max_tokens * 1e3, 3),
        "forward_share": round(timer.total / wall, 3),
    }
    if args.compare_hf:
        row["hf_generate_tokens_per_s"] = round(
            _hf_generate(model, tok, prompts, args, max_tokens), 1
        )
    return row


def _hf_generate(model, tok, prompts, args, max_tokens) -> float:
    """tokens/s of ``model.generate`` on the same batch (sampling, fixed length)."""
    tok.padding_side = "left"
    enc = tok.pad({"input_ids": prompts}, return_tensors="pt").to(model.device)
    kw = dict(
        do_sample=True,
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        num_return_sequences=args.n,
        pad_token_id=tok.pad_token_id,
        eos_token_id=None,
    )
    model.generate(**enc, **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})
    _sync(model.device)
    t0 = time.perf_counter()
    out = model.generate(**enc, **kw)
    _sync(model.device)
    wall = time.perf_counter() - t0
    return (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0] / wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--presets", default="tiny,small")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=None, help="default: tiny 128, small 64")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    p.add_argument("--no-compare-hf", dest="compare_hf", action="store_false")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = [bench_preset(name, args, device) for name in args.presets.split(",")]
    cols = ["preset", "parameters", "device", "rows", "max_tokens", "seconds", "tokens_per_s",
            "ms_per_step", "forward_share", "hf_generate_tokens_per_s"]  # fmt: skip
    cols = [c for c in cols if c in rows[0]]
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))
    text = json.dumps(rows, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
