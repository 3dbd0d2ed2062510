"""Response-token log-probs (+ the metric entropy) and their backward on one micro-batch's logits.

    python benchmarks/logprob_bench.py                       # SmolLM2's shape: 16 x 64 x 49152
    python benchmarks/logprob_bench.py --rows 8 --tokens 32 --vocab 32000

Compares ``data.logprobs.token_logprobs_and_entropy`` (one logsumexp per chunk, closed-form
backward) with the plain autograd path one would write (``log_softmax`` + ``gather``, entropy
from ``softmax``), checkpointed per chunk of rows as the earlier implementation was, and prints
the largest differences between them. One thread, float32, random logits.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.checkpoint import checkpoint

from posttrain.data import logprobs as lp


def plain(logits, targets):
    """Chunked, checkpointed ``log_softmax`` + ``gather``; entropy as a metric."""
    flat, tgt = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    step = max(1, lp.CHUNK_ELEMENTS // flat.shape[-1])
    logps, ents = [], []
    for s in range(0, flat.shape[0], step):
        x, t = flat[s : s + step], tgt[s : s + step]
        logps.append(
            checkpoint(
                lambda x, t: x.log_softmax(-1).gather(-1, t[:, None])[:, 0],
                x,
                t,
                use_reentrant=False,
            )  # fmt: skip
        )
        with torch.no_grad():
            ents.append(-(x.softmax(-1) * x.log_softmax(-1)).sum(-1))
    return torch.cat(logps).view_as(targets), torch.cat(ents).view_as(targets)


def fused(logits, targets):
    return lp.token_logprobs_and_entropy(logits, targets, 1.0, "metric")


def timed(fn, logits, targets, weights):
    x = logits.clone().requires_grad_()
    t0 = time.perf_counter()
    logp, ent = fn(x, targets)
    t1 = time.perf_counter()
    (logp * weights).sum().backward()
    return (t1 - t0, time.perf_counter() - t1), (logp.detach(), ent, x.grad)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(args.rows, args.tokens, args.vocab, generator=g)
    targets = torch.randint(0, args.vocab, (args.rows, args.tokens), generator=g)
    weights = torch.randn(args.rows, args.tokens, generator=g)
    times: dict[str, list[tuple[float, float]]] = {"plain": [], "fused": []}
    outs = {}
    for _ in range(args.repeats):
        for name, fn in (("plain", plain), ("fused", fused)):
            t, outs[name] = timed(fn, logits, targets, weights)
            times[name].append(t)
    print(f"logits {args.rows} x {args.tokens} x {args.vocab}, medians of {args.repeats}:")
    for name, rows in times.items():
        fwd, bwd = (statistics.median(r[i] for r in rows) for i in (0, 1))
        print(f"  {name:<6} forward + entropy {fwd * 1e3:7.1f} ms   backward {bwd * 1e3:7.1f} ms")
    diffs = [float((a - b).abs().max()) for a, b in zip(outs["plain"], outs["fused"], strict=True)]
    print("  largest difference: logprob {:.2e}, entropy {:.2e}, gradient {:.2e}".format(*diffs))


if __name__ == "__main__":
    main()
