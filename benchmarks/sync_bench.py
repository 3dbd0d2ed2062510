"""Weight sync on Ray: bytes, seconds and peak extra memory per sync, one piece vs buckets vs
adapters only.

For each model (the ``tiny`` and ``small`` presets; SmolLM2-135M with LoRA when
``$POSTTRAIN_SMOLLM2`` (default ``outputs/models/smollm2-135m-instruct``) exists) and each policy layout (one unsharded rank; two FSDP ranks on
gloo), it places the roles on a local Ray instance (one torch thread per actor) and times
``RayRoles.sync_weights`` for each way of sending the weights:

- ``one piece``: a single bucket holding every weight: what the sync sent before buckets
  (rank 0's whole state dict in the object store at once; a sharded policy gathers it whole);
- ``buckets``: ``placement.sync_bucket_mb`` buckets, one at a time;
- with LoRA, ``merged`` (one piece, then buckets: full weights with the adapters merged in, what
  the sync sent before) and ``adapters`` (what a LoRA sync sends now).

Per sync: bytes sent, buckets, seconds (median of ``--syncs`` after one warm-up), and how far
each policy rank's and the rollout actor's memory rises above what it held before the syncs
(MiB): ``+private`` is the peak of the process's own (anonymous) resident memory, sampled every
half millisecond — gathered tensors, serialisation buffers; ``+RSS`` the peak of its whole
resident set (``VmHWM``, reset before), which also counts the object store's shared-memory pages
the process wrote or read (the store reuses them; they are not the process's own).

    python benchmarks/sync_bench.py   # alone on the machine: it times
    python benchmarks/sync_bench.py --models tiny --syncs 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from posttrain.model.gguf_import import smollm2_dir

SMOLLM2 = smollm2_dir()
MIB = 2**20
ONE_PIECE_MB = 1e6  # larger than any model here: one bucket


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _start_watch(host) -> tuple[int, int]:
    """Inside an actor: reset its peak RSS and start sampling its private (anonymous) RSS every
    half millisecond; returns both as they are now (bytes)."""
    import threading

    Path("/proc/self/clear_refs").write_text("5")
    now = _status_kib("RssAnon")
    host.sync_watch = watch = {"peak": now, "on": True}

    def sample() -> None:
        while watch["on"]:
            watch["peak"] = max(watch["peak"], _status_kib("RssAnon"))
            time.sleep(0.0005)

    threading.Thread(target=sample, daemon=True).start()
    return _status_kib("VmRSS") * 1024, now * 1024


def _stop_watch(host) -> tuple[int, int]:
    """Peak RSS and peak private RSS since :func:`_start_watch` (bytes)."""
    host.sync_watch["on"] = False
    return _status_kib("VmHWM") * 1024, host.sync_watch["peak"] * 1024


def _use_source(host, limit: int, adapters: bool | None) -> None:
    """Inside a policy actor: plan the sync with this bucket size and payload."""
    from posttrain.placement.weight_sync import WeightSource

    host.role._source = WeightSource(host.role.model, limit, adapters=adapters)


def modes(lora: bool, bucket_mb: float) -> list[tuple[str, float, bool | None]]:
    if not lora:
        return [("one piece", ONE_PIECE_MB, None), ("buckets", bucket_mb, None)]
    return [("merged, one piece", ONE_PIECE_MB, False), ("merged, buckets", bucket_mb, False),
            ("adapters", bucket_mb, True)]  # fmt: skip


def bench(name: str, model: str, lora: list[str], bucket_mb: float, syncs: int, tmp: Path):
    import ray

    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.placement.ray import place_ray
    from posttrain.placement.weight_sync import bucket_bytes

    rows = []
    for layout, sharding, ranks in [("1 rank", "none", 1), ("2 FSDP", "fsdp", 2)]:
        opts = [f"model.name_or_path={model}", f"job.output_root={tmp}", "placement.backend=ray",
                "placement.cpus_per_role=0.5", f"placement.policy_ranks={ranks}",
                f"placement.policy_sharding={sharding}", *lora]  # fmt: skip
        config = load_config("arithmetic", ["--", *opts])
        roles = place_ray(config, "arithmetic", opts, build_objective, str(tmp / "run"))
        try:
            h = roles.actors.handles
            names = [*roles.policy.names, "rollout"]
            for mode, mb, adapters in modes(bool(lora), bucket_mb):
                limit = bucket_bytes(mb)
                ray.get([h[n].__ray_call__.remote(_use_source, limit, adapters)
                         for n in roles.policy.names])  # fmt: skip
                roles._buckets = 0  # the plan changed: ask rank 0 again
                roles.sync_weights()  # warm-up
                before = ray.get([h[n].__ray_call__.remote(_start_watch) for n in names])
                seconds = []
                for _ in range(syncs):
                    t = time.perf_counter()
                    roles.sync_weights()
                    seconds.append(time.perf_counter() - t)
                peaks = ray.get([h[n].__ray_call__.remote(_stop_watch) for n in names])
                rss = [p[0] - b[0] for p, b in zip(peaks, before, strict=True)]
                private = [p[1] - b[1] for p, b in zip(peaks, before, strict=True)]
                rows.append({
                    "model": name, "layout": layout, "mode": mode,
                    "bucket_mb": None if mb == ONE_PIECE_MB else mb, **roles.last_sync,
                    "s_per_sync": statistics.median(seconds),
                    "policy_extra_private": private[:-1], "rollout_extra_private": private[-1],
                    "policy_extra_rss": rss[:-1], "rollout_extra_rss": rss[-1],
                })  # fmt: skip
                print(_line(rows[-1]), flush=True)
        finally:
            roles.close()
    return rows


def _line(r: dict) -> str:
    bucket = "-" if r["bucket_mb"] is None else f"{r['bucket_mb']:g}"
    mib = lambda xs: ", ".join(f"{x / MIB:.0f}" for x in xs)  # noqa: E731
    return (f"{r['model']:14} {r['layout']:7} {r['mode']:18} {bucket:>6} {r['sync/buckets']:>7} "
            f"{r['sync/bytes'] / MIB:9.2f} {r['s_per_sync']:7.3f} "
            f"{mib(r['policy_extra_private']):>10} {r['rollout_extra_private'] / MIB:8.0f} "
            f"{mib(r['policy_extra_rss']):>10} {r['rollout_extra_rss'] / MIB:8.0f}")  # fmt: skip


HEADER = (f"{'model':14} {'layout':7} {'mode':18} {'bucket':>6} {'buckets':>7} {'MiB sent':>9} "
          f"{'s/sync':>7} {'policy +private':>10} {'rollout':>8} {'policy +RSS':>10} "
          f"{'rollout':>8}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "small", "smollm2"])
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=None,
                        help="bucket size (default: 0.1 MiB for tiny, 16 for the others)")  # fmt: skip
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import ray

    from posttrain.model.tiny import build_tiny_model

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    print(HEADER)
    try:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            for name in args.models:
                bucket = args.bucket_mb or (0.1 if name == "tiny" else 16.0)
                if name == "smollm2":
                    if not SMOLLM2.exists():
                        print(f"skipping smollm2: {SMOLLM2} does not exist")
                        continue
                    lora = [f"model.lora_rank={args.lora_rank}", "model.lora_alpha=16"]
                    label = f"smollm2 LoRA r{args.lora_rank}"
                    rows += bench(label, str(SMOLLM2), lora, bucket, args.syncs, tmp)
                else:
                    path = build_tiny_model(name, tmp / name, seed=0)
                    rows += bench(name, str(path), [], bucket, args.syncs, tmp)
    finally:
        ray.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
