"""Does a lag change learning? First step at held-out accuracy >= 0.9, lagged run vs its k = 0 twin.

    python benchmarks/lag_learning.py RUN_DIR [RUN_DIR ...] [--target 0.9] [--max-ratio 1.25]

Each RUN_DIR is a finished (or running) run directory: its ``config.yaml`` gives the algorithm,
``job.seed``, ``rl.off_policy_lag``, ``rl.lr``, ``rl.max_steps``, OPD's ``rl.distillation_mode``
and placement, its ``metrics.jsonl`` the held-out accuracy (``val/accuracy``, greedy) at every
evaluation. Runs pair by (algorithm, mode, seed, learning rate, max steps: the cosine schedule's
length): each lagged run is compared with the one ``k = 0`` run of its pair, ``ratio = step(k) / step(0)``. The first step is an evaluation step, so it is
resolved to ``rl.eval_every``; use the same value on both sides.
``train_s`` is the sum of ``time/step_s`` (the steps alone: no evaluation, no start-up), which
depends on the machine's load. docs/guides/async.md ("Learning under a lag") has the measured
table and the commands that made the runs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from posttrain.config.errors import ConfigError
from posttrain.config.serialize import from_yaml
from posttrain.metrics.sinks import read_metrics


@dataclass(frozen=True)
class RunResult:
    run_dir: str
    algorithm: str
    mode: str  # OPD's rl.distillation_mode; "-" for other algorithms
    seed: int
    lr: float
    max_steps: int
    lag: int
    backend: str
    eval_every: int
    first_step: int | None  # first evaluation step with val/accuracy >= target; None: never
    final_accuracy: float | None
    last_step: int
    train_s: float


def read_run(run_dir: str | Path, target: float) -> RunResult:
    """One run directory's numbers; SystemExit with one line when it is not a run directory."""
    path = Path(run_dir)
    for name in ("config.yaml", "metrics.jsonl"):
        if not (path / name).is_file():
            raise SystemExit(f"lag_learning: {path} has no {name}; pass run directories "
                             "(outputs/<algorithm>/<job.name>)")  # fmt: skip
    try:
        cfg = from_yaml((path / "config.yaml").read_text())
    except ConfigError as e:
        raise SystemExit(f"lag_learning: {path}/config.yaml: {e}") from None
    rows = read_metrics(path / "metrics.jsonl")
    evals = [(int(r["step"]), float(r["val/accuracy"])) for r in rows if "val/accuracy" in r]
    return RunResult(
        run_dir=str(path),
        algorithm=cfg.job.algorithm,
        mode=cfg.rl.distillation_mode if cfg.job.algorithm == "opd" else "-",
        seed=cfg.job.seed,
        lr=cfg.rl.lr,
        max_steps=cfg.rl.max_steps,
        lag=cfg.rl.off_policy_lag,
        backend=cfg.placement.backend,
        eval_every=cfg.rl.eval_every,
        first_step=next((s for s, acc in evals if acc >= target), None),
        final_accuracy=evals[-1][1] if evals else None,
        last_step=max((int(r["step"]) for r in rows), default=0),
        train_s=sum(float(r.get("time/step_s", 0.0)) for r in rows),
    )


def ratios(results: list[RunResult]) -> dict[RunResult, float | None]:
    """Each lagged run's first step over its twin's at k = 0 (same algorithm, mode, seed,
    learning rate and max steps); None when either never reached the target or the pair has no k = 0 run."""
    base: dict[tuple, RunResult] = {}
    seen: dict[tuple, str] = {}
    for r in results:
        key = (*_pair(r), r.lag)
        if key in seen:
            raise SystemExit(f"lag_learning: {seen[key]} and {r.run_dir} are both {_name(r)} "
                             f"k={r.lag}; pass one of them")  # fmt: skip
        seen[key] = r.run_dir
        if r.lag == 0:
            base[_pair(r)] = r
    out: dict[RunResult, float | None] = {}
    for r in results:
        if r.lag == 0:
            continue
        b = base.get(_pair(r))
        ok = b is not None and b.first_step and r.first_step is not None
        out[r] = r.first_step / b.first_step if ok else None
    return out


def _pair(r: RunResult) -> tuple:
    return (r.algorithm, r.mode, r.seed, r.lr, r.max_steps)


def _name(r: RunResult) -> str:
    mode = "" if r.mode == "-" else f" {r.mode}"
    return f"{r.algorithm}{mode} seed {r.seed} lr {r.lr:g} {r.max_steps} steps"


def report(results: list[RunResult], target: float, max_ratio: float) -> list[str]:
    """The table, one line per run (k = 0 before its lagged twins), then the verdict."""
    rat = ratios(results)
    results = sorted(results, key=lambda r: (*_pair(r), r.lag))
    lines = [f"{'algorithm':<9} {'mode':<9} {'lr':>7} {'seed':>4} {'k':>2} {'backend':<7} "
             f"{'eval':>5} {'step>=' + str(target):>9} {'ratio':>6} {'final':>6} {'steps':>6} "
             f"{'train_s':>8}  run"]  # fmt: skip
    for r in results:
        step = "never" if r.first_step is None else str(r.first_step)
        ratio = "" if r.lag == 0 else ("-" if rat[r] is None else f"{rat[r]:.2f}")
        final = "-" if r.final_accuracy is None else f"{r.final_accuracy:.2f}"
        lines.append(f"{r.algorithm:<9} {r.mode:<9} {r.lr:>7g} {r.seed:>4} {r.lag:>2} "
                     f"{r.backend:<7} {r.eval_every:>5} {step:>9} {ratio:>6} {final:>6} "
                     f"{r.last_step:>6} {r.train_s:>8.0f}  {r.run_dir}")  # fmt: skip
    within = [v is not None and v <= max_ratio for v in rat.values()]
    if not within:
        return [*lines, "no lagged run among these: nothing to compare (pass k>0 runs too)"]
    lines.append(f"lagged runs reaching {target} within {max_ratio}x the steps of k=0: "
                 f"{sum(within)} of {len(within)}"
                 + ("" if within and all(within) else " (target missed)"))  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--target", type=float, default=0.9, help="held-out accuracy to reach")
    p.add_argument("--max-ratio", type=float, default=1.25, help="allowed step ratio k / k=0")
    args = p.parse_args(argv)
    results = [read_run(d, args.target) for d in args.runs]
    print("\n".join(report(results, args.target, args.max_ratio)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
