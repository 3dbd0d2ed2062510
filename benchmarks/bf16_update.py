"""One GRPO update on one batch, from the same state, in float32, in bf16 with autocast's own
casts of the frozen weights, and in bf16 with them cast once (``trainer/frozen_casts.py``).

    python benchmarks/bf16_update.py --workload smollm2 --threads 1 --rounds 2

The batch is sampled once (bf16 rollout copy); before each update the trainable weights and the
AdamW state are restored, so each setting does the same work. The settings run in turn, ``--rounds``
times (load from other jobs falls on all of them alike); the fastest of each is printed, and
whether the two bf16 updates gave bit for bit the same weights. The workload is one of
``vs_trl.py``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = ("float32", "bf16_autocast_casts", "bf16_cast_once")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="smollm2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    import vs_trl
    from bench_posttrain import PosttrainSide

    from posttrain.run.online import collect
    from posttrain.run.records import quiet_libraries
    from posttrain.trainer.frozen_casts import FrozenCasts

    quiet_libraries()
    torch.set_num_threads(args.threads)
    w = vs_trl.workload(args.workload)
    if w is None:
        sys.exit(f"no model folder at {vs_trl.SMOLLM2_DIR}; create it with: {vs_trl.SMOLLM2_HOWTO}")
    extra = ("model.dtype=bfloat16", "rollout.dtype=bfloat16",
             f"placement.torch_threads_per_process={args.threads}")  # fmt: skip
    swapped = FrozenCasts.swapped
    with tempfile.TemporaryDirectory() as tmp:
        side = PosttrainSide(w, vs_trl.model_folder(w, Path(tmp)), Path(tmp) / "out", 1, extra)
        _, result, _ = collect(side.config, side.roles, side.tokenizer, side.tasks, 0, 1)
        policy = side.roles.policy
        params = [p for p in policy.model.parameters() if p.requires_grad]
        start = [p.detach().clone() for p in params]
        optimizer = copy.deepcopy(policy.trainer.optimizer.state_dict())
        times: dict[str, list[float]] = {s: [] for s in SETTINGS}
        after: dict[str, list] = {}
        try:
            for _ in range(args.rounds):
                for setting in SETTINGS:
                    policy.trainer.precision = "float32" if setting == "float32" else "bfloat16"
                    FrozenCasts.swapped = (
                        (lambda self: contextlib.nullcontext())
                        if setting == "bf16_autocast_casts"
                        else swapped
                    )
                    with torch.no_grad():
                        for p, s in zip(params, start, strict=True):
                            p.copy_(s)
                    policy.trainer.optimizer.load_state_dict(copy.deepcopy(optimizer))
                    t0 = time.perf_counter()
                    policy.train(result.batch)
                    times[setting].append(time.perf_counter() - t0)
                    after.setdefault(setting, [p.detach().clone() for p in params])
                    print(f"  {setting}: {times[setting][-1]:.2f} s", flush=True)
        finally:
            FrozenCasts.swapped = swapped
    best = {s: min(t) for s, t in times.items()}
    equal = all(
        torch.equal(a, b)
        for a, b in zip(after["bf16_autocast_casts"], after["bf16_cast_once"], strict=True)
    )
    print(f"{args.workload}, {args.threads} thread(s), fastest of {args.rounds}: " + ", ".join(
        f"{s} {t:.2f} s" for s, t in best.items()))  # fmt: skip
    print(f"float32 / bf16 cast once: {best['float32'] / best['bf16_cast_once']:.2f}x; "
          f"autocast casts / cast once: {best['bf16_autocast_casts'] / best['bf16_cast_once']:.2f}x; "
          f"the two bf16 updates bit for bit equal: {equal}; load {os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
