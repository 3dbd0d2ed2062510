"""Where a GRPO run's peak resident memory goes: weights, optimizer, gradients, activations,
logits, the rollout's KV cache and what the allocator keeps.

Runs ``posttrain grpo`` in this process (a few steps of a recipe) with three probes:

- an RSS sampler thread (``/proc/self/statm`` every few ms), attributing the peak to the phase
  running then (model load, rollout, update, the rest);
- tensor sizes: parameters, trainable parameters, their gradients and the optimizer state, read
  from the trainer after its first update;
- saved-tensor hooks around each micro-batch's objective call: the bytes autograd keeps for the
  backward (activations, including the logits when they are kept), distinct storages only,
  parameters excluded.

The rollout's KV cache and the micro-batch logits are computed from their shapes (the engine
preallocates ``rows x (prompt + max_tokens)`` keys and values per layer). What the peak holds
beyond the sum of the parts is temporaries and allocator overhead (freed memory not returned to
the system). ``posttrain config show`` estimates the same parts before a run
(``control/memory.py``); ``tests/test_memory_estimate.py`` measures peaks with this module.

    python benchmarks/memory_profile.py --config smollm2_reasoning_gym -- rl.max_steps=2

Prints a table and, with ``--json PATH``, writes the numbers.

bf16 against float32 (each in its own process, so each peak is its own; same recipe, seed,
samples per step and threads)::

    python benchmarks/memory_profile.py --dtype float32 --json f32.json -- \
        model.name_or_path=outputs/models/smollm2-135m-instruct rl.max_steps=3
    python benchmarks/memory_profile.py --dtype bfloat16 --json bf16.json -- \
        model.name_or_path=outputs/models/smollm2-135m-instruct rl.max_steps=3
    python benchmarks/memory_profile.py --compare f32.json bf16.json

``--dtype D`` sets ``model.dtype=D`` (float32 masters either way; bf16 autocast compute) and
``rollout.dtype`` to ``--rollout-dtype`` (default: D). Both runs draw their first step's samples
from the same float32 weights only with ``--rollout-dtype float32``; later steps follow each
run's own updates, so ``--compare`` also prints seconds per thousand tokens. ``--smoke`` runs the
tiny arithmetic recipe for 2 steps (seconds; CI runs it in both dtypes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 1e6


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class RssSampler:
    """Peak RSS per phase, sampled every ``interval`` seconds on a daemon thread."""

    def __init__(self, interval: float = 0.002) -> None:
        self.phase = "other"
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self._interval)

    def sample(self) -> None:
        rss = rss_bytes()
        if rss > self.peaks.get(self.phase, 0):
            self.peaks[self.phase] = rss

    @contextlib.contextmanager
    def in_phase(self, name: str):
        before, self.phase = self.phase, name
        self.sample()
        try:
            yield
        finally:
            self.sample()
            self.phase = before

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def _tensor_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


class Probes:
    """Patches the trainer and the online loop to record phases, tensor sizes and activations."""

    def __init__(self, sampler: RssSampler) -> None:
        self.sampler = sampler
        self.tensors: dict[str, int] = {}
        self.saved_peak = 0
        self.logits_peak = 0
        self.micro_batches: list[tuple[int, int]] = []
        self.kv_cache = 0

    @contextlib.contextmanager
    def installed(self):
        import torch

        from posttrain.algorithm.primitives.objective import Objective
        from posttrain.data.padding import trim_padding
        from posttrain.placement.roles import PolicyRole
        from posttrain.run import online
        from posttrain.trainer.llm import LLMTrainer

        probes = self
        originals = (online.collect, LLMTrainer.train_on_batch, Objective.__call__,
                     PolicyRole.__init__)  # fmt: skip
        collect, train_on_batch, call, policy_init = originals

        def timed_load(role, *a, **kw):
            with probes.sampler.in_phase("load"):
                policy_init(role, *a, **kw)

        def timed_collect(config, roles, *a, **kw):
            with probes.sampler.in_phase("rollout"):
                out = collect(config, roles, *a, **kw)
            batch = out[1].batch
            rows, width = len(batch), batch.prompt_width + config.rollout.max_tokens
            cfg = roles.policy.trainer.model.config if hasattr(roles.policy, "trainer") else None
            if cfg is not None:
                size = rollout_element_size(config)
                probes.kv_cache = max(probes.kv_cache, kv_cache_bytes(cfg, rows, width, size))
            return out

        def timed_train(trainer, *a, **kw):
            with probes.sampler.in_phase("update"):
                out = train_on_batch(trainer, *a, **kw)
            if not probes.tensors:
                probes.tensors = trainer_tensor_bytes(trainer)
            return out

        def measured_call(objective, model, batch):
            params = {p.untyped_storage().data_ptr() for p in model.parameters()}
            saved: dict[int, int] = {}

            def pack(t):
                s = t.untyped_storage()
                if s.data_ptr() not in params:
                    saved[s.data_ptr()] = s.nbytes()
                return t

            trimmed = trim_padding(batch)
            probes.micro_batches.append(tuple(trimmed.input_ids.shape))
            probes.logits_peak = max(probes.logits_peak, logits_bytes(model, trimmed))
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = call(objective, model, batch)
            probes.saved_peak = max(probes.saved_peak, sum(saved.values()))
            return out

        online.collect = timed_collect
        PolicyRole.__init__ = timed_load
        LLMTrainer.train_on_batch = timed_train
        Objective.__call__ = measured_call
        try:
            yield self
        finally:
            (online.collect, LLMTrainer.train_on_batch, Objective.__call__,
             PolicyRole.__init__) = originals  # fmt: skip


def trainer_tensor_bytes(trainer) -> dict[str, int]:
    params = list({id(p): p for p in trainer.model.parameters()}.values())
    trainable = [p for p in params if p.requires_grad]
    state = [
        v for s in trainer.optimizer.state.values() for v in s.values() if hasattr(v, "nbytes")
    ]
    return {
        "weights": _tensor_bytes(params),
        "trainable": _tensor_bytes(trainable),
        "gradients": sum(p.numel() * p.element_size() for p in trainable),
        "optimizer": sum(v.nbytes for v in state),
    }


def rollout_element_size(config) -> int:
    """Bytes per element of the rollout's weights and KV cache (``rollout.dtype`` resolved)."""
    import torch

    from posttrain.placement.device import resolve_device, rollout_dtype

    device = resolve_device(config.placement.device)
    return getattr(torch, rollout_dtype(config.rollout.dtype, device)).itemsize


def kv_cache_bytes(config, rows: int, width: int, element_size: int = 4) -> int:
    """Keys and values of every layer for ``rows`` sequences of ``width`` tokens."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * rows * width * heads * head_dim * element_size


def logits_bytes(model, batch) -> int:
    """float32 logits one micro-batch's scoring holds at once (the chunked head's chunk)."""
    from posttrain.data.logprobs import LOGIT_CHUNK_ELEMENTS

    vocab = model.config.vocab_size
    rows, r = batch.batch_size, batch.response_width
    per_row = r * vocab
    rows = min(rows, max(1, LOGIT_CHUNK_ELEMENTS // per_row))
    return rows * per_row * 4


def profile(config: str, overrides: list[str], threads: int) -> dict[str, Any]:
    """Run the recipe with the probes; the measured parts and peaks, in bytes."""
    import torch

    torch.set_num_threads(threads)
    import transformers.models.llama.modeling_llama  # noqa: F401  (counted in the runtime)

    from posttrain.entrypoints.cli import main
    from posttrain.entrypoints.grpo import run as _grpo  # noqa: F401

    with tempfile.TemporaryDirectory(prefix="memory_profile_") as out:
        argv = ["grpo", "--config", config, "--", "logging.progress=false",
                f"job.output_root={out}", f"placement.torch_threads_per_process={threads}",
                "rl.eval_every=0", "rl.save_every=0", *overrides]  # fmt: skip
        with RssSampler() as sampler:
            runtime = rss_bytes()
            probes = Probes(sampler)
            with probes.installed():
                t0 = time.perf_counter()
                code = main(argv)
                seconds = time.perf_counter() - t0
        metrics = [json.loads(x) for x in Path(out).rglob("metrics.jsonl").__next__().open()]
    if code != 0:
        raise SystemExit(f"posttrain grpo exited {code}")
    peak = max(sampler.peaks.values())
    return {
        "config": config,
        "overrides": overrides,
        "mmap_threshold": os.environ.get("MALLOC_MMAP_THRESHOLD_"),
        "runtime": runtime,
        "phase_peaks": sampler.peaks,
        "peak": peak,
        **probes.tensors,
        "activations": probes.saved_peak,
        "logits": probes.logits_peak,
        "kv_cache": probes.kv_cache,
        "micro_batches": probes.micro_batches,
        "seconds": seconds,
        "step_s": [m.get("time/step_s") for m in metrics],
        "train_s": [m.get("time/train_s") for m in metrics],
        "rollout_s": [m.get("time/rollout_s") for m in metrics],
        "train_tokens": [m.get("train/tokens") for m in metrics],
        "threads": threads,
        "padding_fraction": [m.get("train/padding_fraction") for m in metrics],
    }


def table(r: dict[str, Any]) -> str:
    f = lambda b: f"{b / MB:,.0f}"  # noqa: E731
    peaks = r["phase_peaks"]
    update = peaks.get("update", 0)
    parts = r["runtime"] + r["weights"] + r["gradients"] + r["optimizer"] + r["activations"]
    rows = [
        ("process before the model (python, torch, transformers)", r["runtime"]),
        ("weights (all parameters, float32)", r["weights"]),
        ("of which trainable", r["trainable"]),
        ("gradients (trainable)", r["gradients"]),
        ("optimizer state (AdamW: 2 per trainable)", r["optimizer"]),
        ("activations kept for backward (largest micro-batch)", r["activations"]),
        ("logits of one micro-batch (float32, inside the activations when kept)", r["logits"]),
        ("rollout KV cache (rows x (prompt + response), all layers, rollout dtype)", r["kv_cache"]),
        ("peak RSS: model load / rollout / update / the rest",
         None, " / ".join(f(peaks.get(p, 0)) for p in ("load", "rollout", "update", "other"))),
        ("update peak minus the parts above (temporaries, allocator)", update - parts),
        ("**peak RSS**", r["peak"]),
    ]  # fmt: skip
    lines = ["| part | MB |", "|---|---|"]
    for row in rows:
        lines.append(f"| {row[0]} | {row[2] if row[1] is None else f(row[1])} |")
    lines.append(
        f"\n{r['config']} {' '.join(r['overrides'])}: steps {r['step_s']} s (update "
        f"{r['train_s']} s), padding fraction {r['padding_fraction']}, micro-batches "
        f"{sorted(set(map(tuple, r['micro_batches'])))[:6]}"
    )
    return "\n".join(lines)


SMOKE_OPTS = ["rl.max_steps=2", "data.prompts_per_step=2", "rollout.n=2", "rollout.max_tokens=3",
              "data.train_size=20", "data.val_size=4", "rl.micro_batch_size=4"]  # fmt: skip


def _measured(values: list) -> list:
    """The steps after the first (allocator and kernel warm-up) when there are more."""
    values = [v for v in values if v is not None]
    return values[1:] if len(values) > 1 else values


def compare(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Two profiles side by side: per step (first step dropped), per 1000 update tokens, peak."""
    import statistics

    def row(r):
        tokens = statistics.mean(_measured(r["train_tokens"]))
        step, train = (
            statistics.mean(_measured(r["step_s"])),
            statistics.mean(_measured(r["train_s"])),
        )
        rollout = statistics.mean(_measured(r["rollout_s"]))
        return {"step s": step, "update s": train, "rollout s": rollout, "update tokens": tokens,
                "update s / 1k tokens": 1000 * train / tokens, "peak RSS MB": r["peak"] / MB}  # fmt: skip

    ra, rb = row(a), row(b)
    name = lambda r: " ".join(r["overrides"]) or r["config"]  # noqa: E731
    lines = [f"A: {name(a)} ({a['threads']} threads)", f"B: {name(b)} ({b['threads']} threads)",
             "", "| | A | B | A / B |", "|---|---|---|---|"]  # fmt: skip
    for k in ra:
        lines.append(f"| {k} | {ra[k]:,.3f} | {rb[k]:,.3f} | {ra[k] / rb[k]:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="smollm2_reasoning_gym")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="write the numbers here")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                    help="model.dtype (and rollout.dtype unless --rollout-dtype)")  # fmt: skip
    ap.add_argument("--rollout-dtype", choices=("float32", "bfloat16"), default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny recipe, 2 steps (CI)")
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("A.json", "B.json"), default=None,
                    help="print two saved profiles side by side (B against A)")  # fmt: skip
    args = ap.parse_args(own)
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        print(compare(a, b))
        return 0
    if args.smoke:
        args.config, args.threads = "arithmetic", 1
        overrides = [*SMOKE_OPTS, *overrides]
    if args.dtype or args.rollout_dtype:
        dtype = args.dtype or "float32"
        overrides = [f"model.dtype={dtype}", f"rollout.dtype={args.rollout_dtype or dtype}",
                     *overrides]  # fmt: skip
    result = profile(args.config, overrides, args.threads)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
