"""CPU seconds a Ray actor spends before its role can work: a fresh process that imports the
host module (``placement/ray_host.py``), builds the host and starts one role in it, as a Ray
worker does after Ray's own start (not counted here: ~0.4 s of ``import ray`` and its threads).

    python benchmarks/role_start.py --rounds 3

Every Ray run starts one such process per policy rank, one for the rollout, one for the reward
and one per declared role; on a small machine their imports are most of a short run's CPU.
Cases: the reward role (it needs no model code: the list of heavy packages each process loaded
is printed beside it), and the policy and rollout roles on a tiny model. Each case runs
``--rounds`` times in turn; the median of each is printed.
Run it from a quiet machine: the numbers are CPU time, but a busy machine inflates them too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: What the actor's process does, with the host and role classes by name (as Ray's pickles
#: carry them: by reference, imported in the actor).
CHILD = """
import importlib, json, os, resource, sys
from posttrain.placement import ray_host
host_name, module, role_name, opts = sys.argv[1:]
role = getattr(importlib.import_module(module), role_name)
host = getattr(ray_host, host_name)(1, os.getcwd())
kwargs = {}
if role_name == "PolicyRole":  # what the Ray placement passes a policy rank
    from posttrain.config.build import build_objective
    kwargs = {"build_objective_fn": build_objective, "run_dir": os.getcwd()}
host.start(role, "arithmetic", json.loads(opts), kwargs)
use = resource.getrusage(resource.RUSAGE_SELF)
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"transformers", "pytest"})
print(json.dumps({"cpu_s": use.ru_utime + use.ru_stime, "loaded": heavy}))
"""

#: case -> (host class, role module, role class, whether it needs the model folder)
CASES = {
    "reward": ("RewardHost", "posttrain.placement.reward_role", "RewardRole", False),
    "policy": ("PolicyHost", "posttrain.placement.roles", "PolicyRole", True),
    "rollout": ("RolloutHost", "posttrain.placement.roles", "RolloutRole", True),
}


def start_once(case: str, model: Path, cwd: Path) -> dict:
    host, module, role, needs_model = CASES[case]
    opts = json.dumps([f"model.name_or_path={model}"] if needs_model else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, host, module, role, opts], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"role_start: case {case!r} failed: {proc.stderr.strip().splitlines()[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from posttrain.model.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model("tiny", Path(tmp) / "tiny", seed=0)
        runs: dict[str, list[dict]] = {case: [] for case in CASES}
        for _ in range(args.rounds):
            for case in CASES:
                runs[case].append(start_once(case, model, Path(tmp)))
    print(f"{'role':<20} {'CPU s (median)':>15}  loads")
    for case, rs in runs.items():
        cpu = statistics.median(r["cpu_s"] for r in rs)
        print(f"{case:<20} {cpu:>15.2f}  {', '.join(rs[0]['loaded']) or '-'}")


if __name__ == "__main__":
    main()
