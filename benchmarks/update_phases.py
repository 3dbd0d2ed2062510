"""Where a GRPO update's time goes: one collected batch, the update timed by phase (and by op).

    python benchmarks/update_phases.py --workload smollm2 --repeats 2
    python benchmarks/update_phases.py --workload small --profile      # + torch.profiler's ops
    python benchmarks/update_phases.py --workload smollm2 --bf16 --profile   # bf16 compute

The workload is one of ``vs_trl.py``'s (the same posttrain settings). One rollout batch is
collected, then the update runs ``--repeats`` times on that same batch (each repeat moves the
weights; the work is the same). Phases: the frozen reference's forwards (a LoRA reference is the
policy with its adapters off), grad-enabled policy forwards, the optimizer step, and the rest
(loss math and backward).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="smollm2")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--profile", action="store_true", help="print the top ops of the last one")
    ap.add_argument("--bf16", action="store_true", help="model.dtype=bfloat16 (bf16 autocast)")
    ap.add_argument("--top", type=int, default=25, help="ops --profile prints")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    import torch.optim.optimizer as optimizer_hooks
    import vs_trl
    from bench_posttrain import PosttrainSide

    from posttrain.run.online import collect
    from posttrain.run.records import quiet_libraries

    quiet_libraries()
    w = vs_trl.workload(args.workload)
    if w is None:
        sys.exit(f"no model folder at {vs_trl.SMOLLM2_DIR}; create it with: {vs_trl.SMOLLM2_HOWTO}")
    os.environ.setdefault("OMP_NUM_THREADS", str(w.threads))
    torch.set_num_threads(w.threads)
    with tempfile.TemporaryDirectory() as tmp:
        extra = ("model.dtype=bfloat16", "rollout.dtype=bfloat16") if args.bf16 else ()
        side = PosttrainSide(w, vs_trl.model_folder(w, Path(tmp)), Path(tmp) / "out", 1, extra)
        _, result, times = collect(side.config, side.roles, side.tokenizer, side.tasks, 0, 1)
        batch = result.batch
        print(f"{args.workload}: batch {tuple(batch.input_ids.shape)} (prompt width "
              f"{batch.prompt_width}), {int(batch.response_mask.sum())} response tokens, "
              f"rollout {times['time/rollout_s']:.1f} s")  # fmt: skip
        optim = {"s": 0.0}
        t_opt = [0.0]
        pre = optimizer_hooks.register_optimizer_step_pre_hook(
            lambda *a: t_opt.__setitem__(0, time.perf_counter())
        )
        post = optimizer_hooks.register_optimizer_step_post_hook(
            lambda *a: optim.__setitem__("s", optim["s"] + time.perf_counter() - t_opt[0])
        )
        rows = []
        for i in range(args.repeats):
            profiler = None
            if args.profile and i == args.repeats - 1:
                from torch.profiler import ProfilerActivity, profile

                profiler = profile(activities=[ProfilerActivity.CPU])
                profiler.__enter__()
            optim["s"] = 0.0
            side.clock.armed = True
            t0 = time.perf_counter()
            side.roles.policy.train(batch)
            total = time.perf_counter() - t0
            side.clock.armed = False
            if profiler is not None:
                profiler.__exit__(None, None, None)
                print(
                    profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
                )
            phases = side.clock.take()
            phases["optimizer"] = optim["s"]
            phases["loss_backward"] = total - sum(phases.values())
            phases["update"] = total
            rows.append(phases)
            print(f"  update {i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))
        pre.remove()
        post.remove()
    keys = rows[0].keys()
    print("median: " + ", ".join(f"{k} {statistics.median(r.get(k, 0) for r in rows):.2f} s"
                                 for k in keys))  # fmt: skip
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
