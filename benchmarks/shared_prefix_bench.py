"""Shared-prefix forwards vs full-sequence forwards: time and exactness on one micro-batch.

    PYTHONPATH=src .venv/bin/python benchmarks/shared_prefix_bench.py --preset small \\
        --prompt 300 --response 64 --n 8 --rows 16

A micro-batch of ``rows`` rows (``rows / n`` prompts of ``--prompt`` tokens, left-padded to
different lengths, ``n`` responses of ``--response`` tokens each) is scored with
``rl.shared_prefix=off`` and ``on``: a no-grad forward (reference, π_old, teacher) and a
grad-enabled forward + backward (the policy update). Prints the median of ``--reps`` timings per
mode, the speedup, and the largest logprob difference between the modes. ``--model DIR`` times an
HF model folder (e.g. SmolLM2) instead of a tiny preset; ``--lora R`` wraps it in LoRA adapters.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def make_batch(vocab: int, groups: int, n: int, p: int, r: int):
    import torch

    from posttrain.data.trajectory import TrajectoryBatch

    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(groups * n, p + r, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for k in range(groups):
        length = p - (k * max(1, p // 8)) % p  # different paddings in one micro-batch
        prompt = torch.randint(3, vocab, (length,), generator=g)
        for j in range(k * n, (k + 1) * n):
            ids[j, p - length : p], mask[j, p - length :] = prompt, 1
            ids[j, p:] = torch.randint(3, vocab, (r,), generator=g)
    b = groups * n
    return TrajectoryBatch(ids, mask, torch.ones(b, r, dtype=torch.bool),
                           torch.arange(b) // n, torch.arange(b))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--model", default=None, help="an HF model folder instead of a preset")
    ap.add_argument("--lora", type=int, default=0)
    ap.add_argument("--prompt", type=int, default=300)
    ap.add_argument("--response", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    from posttrain.data.logprobs import response_logprobs
    from posttrain.data.prefix import use_shared_prefix

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.model:
        from posttrain.model.loading import load_policy

        model, _ = load_policy(args.model, None, "float32", "cpu")
    else:
        from transformers import LlamaForCausalLM

        from posttrain.model.tiny import tiny_config

        model = LlamaForCausalLM(tiny_config(args.preset))
    if args.lora:
        from posttrain.model.lora import apply_lora

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = apply_lora(model, args.lora, 2.0 * args.lora, targets)
    batch = make_batch(model.config.vocab_size, args.rows // args.n, args.n, args.prompt,
                       args.response)  # fmt: skip
    times: dict[str, dict[str, list[float]]] = {"off": {}, "on": {}}
    logps = {}
    for rep in range(args.reps + 1):  # the first round warms up
        for mode in ("off", "on"):
            with use_shared_prefix(mode):
                t0 = time.perf_counter()
                with torch.no_grad():
                    logps[mode] = response_logprobs(model, batch)
                t1 = time.perf_counter()
                model.zero_grad(set_to_none=True)
                (response_logprobs(model, batch) * batch.response_mask).sum().backward()
                t2 = time.perf_counter()
            if rep:
                times[mode].setdefault("no_grad_fwd", []).append(t1 - t0)
                times[mode].setdefault("fwd_bwd", []).append(t2 - t1)
    diff = float((logps["on"] - logps["off"])[batch.response_mask].abs().max())
    name = args.model or args.preset
    print(f"{name}{f' + LoRA r{args.lora}' if args.lora else ''}: {args.rows} rows, "
          f"{args.rows // args.n} prompts of <= {args.prompt} tokens, {args.response}-token "
          f"responses, {args.threads} thread(s); medians of {args.reps} (s)")  # fmt: skip
    print(f"{'phase':<14}{'unshared':>10}{'shared':>10}{'speedup':>9}")
    for phase in ("no_grad_fwd", "fwd_bwd"):
        off, on = (statistics.median(times[m][phase]) for m in ("off", "on"))
        print(f"{phase:<14}{off:>10.3f}{on:>10.3f}{off / on:>8.2f}x")
    print(f"max |logprob shared - unshared| = {diff:.2e}; load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
