"""Memory per policy rank: replicated vs FSDP2-sharded, from the tensors' sizes and peak RSS.

For each model (the ``small`` tiny preset, and SmolLM2-135M when
``$POSTTRAIN_SMOLLM2`` (default ``outputs/models/smollm2-135m-instruct``) exists) it trains a few GRPO steps on synthetic batches with 1 unsharded rank, 2 replicated
ranks and 2 FSDP ranks (gloo, one torch thread per process) and reports per rank:

- parameter, gradient and AdamW-state bytes this rank holds (local shards' ``numel *
  element_size``),
- peak RSS of the training steps (the high-water mark is reset after the model is loaded and
  wrapped, so loading is reported separately as ``load_peak``); ``2 FSDP`` loads as a run does
  (rank 1 builds a meta-device skeleton and receives its shards from rank 0), ``2 FSDP, full
  load`` as it did before (every rank loads the whole model, then shards it),
- seconds per step, and the largest relative parameter difference to the unsharded run.

    python benchmarks/fsdp_memory.py   # alone on the machine: it times and measures memory
    python benchmarks/fsdp_memory.py --models small --steps 3 --json out.json
    python benchmarks/fsdp_memory.py --models small --setups "2 FSDP" "2 FSDP, full load"
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from posttrain.model.gguf_import import smollm2_dir

SMOLLM2 = smollm2_dir()


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _rank(rank: int, world: int, port: int, job: dict, queue) -> None:
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from posttrain.config import PosttrainConfig, apply_overrides
    from posttrain.config.build import build_objective, objective_context
    from posttrain.model.loading import load_policy
    from posttrain.placement.dispatch import shard_batch
    from posttrain.testing import synthetic_batch
    from posttrain.trainer import LLMTrainer
    from posttrain.trainer.sharding import shard_bytes

    cfg = apply_overrides(PosttrainConfig(), [f"rl.micro_batch_size={job['micro']}"])
    model, _ = load_policy(job["model"], None, "float32", skeleton=job["skeleton"] and rank > 0)
    trainer = LLMTrainer(
        model, build_objective(cfg.rl, objective_context(cfg)), lr=1e-4,
        micro_batch_size=cfg.rl.micro_batch_size, sharding=job["sharding"],
    )  # fmt: skip
    del model
    load_peak = _status_kib("VmHWM")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS to the current RSS
    vocab = trainer.model.config.vocab_size
    times = []
    for step in range(job["steps"]):
        batch = synthetic_batch(vocab, job["rows"], seed=step, prompt_width=16, response_width=32)
        t = time.perf_counter()
        trainer.train_on_batch(shard_batch(batch, world, 1)[rank])
        times.append(time.perf_counter() - t)
    row = {
        **shard_bytes(trainer.model, trainer.optimizer),
        "train_peak_rss": _status_kib("VmHWM") * 1024,
        "load_peak_rss": load_peak * 1024,
        "s_per_step": sum(times[1:]) / max(len(times) - 1, 1),
    }
    rows = [None] * world
    dist.all_gather_object(rows, row)
    if trainer.sharded:
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(trainer.model, options=opts)
    else:
        full = {k: v.detach() for k, v in trainer.model.state_dict().items()}
    if rank == 0:
        torch.save(full, job["params_out"])
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def run(job: dict, world: int) -> list[dict]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, port, job, queue)) for r in range(world)]
    for p in procs:
        p.start()
    rows = queue.get(timeout=3600)
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"a rank of {job} exited with {p.exitcode}")
    return rows


def max_rel(a_path: str, b_path: str) -> float:
    import torch

    a, b = torch.load(a_path, weights_only=True), torch.load(b_path, weights_only=True)
    return max(float((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-30)) for k in b)


#: label -> (sharding, ranks, whether ranks > 0 load a meta-device skeleton)
SETUPS = {
    "1 rank": ("none", 1, False), "2 replicated": ("none", 2, False),
    "2 FSDP, full load": ("fsdp", 2, False), "2 FSDP": ("fsdp", 2, True),
}  # fmt: skip


def bench(name: str, model: str, steps: int, rows: int, micro: int, tmp: Path,
          setups: list[str]) -> list[dict]:  # fmt: skip
    """Every setup of ``setups`` in order; ``max rel`` is against the first one's parameters."""
    out = []
    ref = None
    for label in setups:
        sharding, world, skeleton = SETUPS[label]
        params_out = str(tmp / f"{name}-{sharding}{world}{'-meta' if skeleton else ''}.pt")
        job = {"model": model, "sharding": sharding, "steps": steps, "rows": rows,
               "micro": micro, "params_out": params_out, "skeleton": skeleton}  # fmt: skip
        ref = ref or params_out
        for r, row in enumerate(run(job, world)):
            row.update(model=name, setup=label, rank=r, max_rel_vs_1_rank=max_rel(params_out, ref))
            out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["small", "smollm2"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--setups",
        nargs="+",
        default=list(SETUPS),
        choices=list(SETUPS),
        help="which setups, in this order (max rel is against the first)",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from posttrain.model.tiny import build_tiny_model

    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in args.models:
            if name == "smollm2":
                if not SMOLLM2.exists():
                    print(f"skipping smollm2: {SMOLLM2} does not exist")
                    continue
                rows += bench(name, str(SMOLLM2), args.steps, 8, 4, tmp, args.setups)
            else:
                path = build_tiny_model(name, tmp / name, seed=0)
                rows += bench(name, str(path), args.steps, 8, 4, tmp, args.setups)
    mib = 2**20
    print(f"{'model':8} {'setup':18} {'rank':>4} {'params':>8} {'grads':>8} {'optim':>8} "
          f"{'sum':>8} {'train RSS':>9} {'load RSS':>9} {'s/step':>7} {'max rel':>9}  (MiB)")  # fmt: skip
    for r in rows:
        total = r["params"] + r["grads"] + r["optimizer"]
        print(f"{r['model']:8} {r['setup']:18} {r['rank']:>4} {r['params'] / mib:8.1f} "
              f"{r['grads'] / mib:8.1f} {r['optimizer'] / mib:8.1f} {total / mib:8.1f} "
              f"{r['train_peak_rss'] / mib:9.0f} {r['load_peak_rss'] / mib:9.0f} "
              f"{r['s_per_step']:7.2f} {r['max_rel_vs_1_rank']:9.1e}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
