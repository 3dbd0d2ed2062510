"""Does a lag change learning? First step at held-out accuracy >= 0.9, lagged run vs its k = 0 twin.

    python benchmarks/lag_learning.py RUN_DIR [RUN_DIR ...] [--target 0.9] [--max-ratio 1.25]
        [--hold 3]

Each RUN_DIR is a finished (or running) run directory: its ``config.yaml`` gives the algorithm,
``job.seed``, ``rl.off_policy_lag``, ``rl.lr``, ``rl.max_steps``, OPD's ``rl.distillation_mode``
and placement, its ``metrics.jsonl`` the held-out accuracy (``val/accuracy``, greedy) at every
evaluation. Runs pair by (algorithm, mode, seed, learning rate, max steps: the cosine schedule's
length): each lagged run is compared with the one ``k = 0`` run of its pair, ``ratio = step(k) / step(0)``. The first step is an evaluation step, so it is
resolved to ``rl.eval_every``; use the same value on both sides. The first step is a minimum
over a noisy curve (one evaluation of 20 held-out problems can reach 0.9 and the next fall to
0.7), so the table also gives the first step from which the accuracy stays at the target for
``--hold`` evaluations in a row (``held``), its ratio, and a second count on that ratio; the
verdict stays the first step's. Where the ``k = 0`` run never gets there and its twin does, the
ratio is a bound, ``<`` the twin's step over the last step ``k = 0`` recorded, and counts as within.
What the verdict can resolve is printed with it: the chance that a pair passes if the lag cost
nothing at all (``chance``: the first steps of all the runs given, pooled as draws of one
distribution), and so that every pair does.
``train_s`` is the sum of ``time/step_s`` (the steps alone: no evaluation, no start-up), which
depends on the machine's load. docs/guides/async.md ("Learning under a lag") has the measured
table and the commands that made the runs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from seeds import first_held, step_text

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
    held_step: int | None  # first step from which it stays >= target for `hold` evaluations
    final_accuracy: float | None
    last_step: int
    train_s: float


def read_run(run_dir: str | Path, target: float, hold: int = 3) -> RunResult:
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
        first_step=first_held(evals, target, 1),
        held_step=first_held(evals, target, hold),
        final_accuracy=evals[-1][1] if evals else None,
        last_step=max((int(r["step"]) for r in rows), default=0),
        train_s=sum(float(r.get("time/step_s", 0.0)) for r in rows),
    )


class Ratio(NamedTuple):
    value: float
    bound: bool  # the k = 0 run never got there: the ratio is below ``value`` (its last step)


def ratios(results: list[RunResult], step: str = "first_step") -> dict[RunResult, Ratio | None]:
    """Each lagged run's first step (or ``step="held_step"``) over its twin's at k = 0 (same
    algorithm, mode, seed, learning rate and max steps). Where the lagged run got there and its
    twin never did, the twin's last step recorded stands in (a bound: the ratio is below it).
    None when the lagged run never got there or the pair has no k = 0 run."""
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
    out: dict[RunResult, Ratio | None] = {}
    for r in results:
        if r.lag == 0:
            continue
        b, mine = base.get(_pair(r)), getattr(r, step)
        theirs = None if b is None else getattr(b, step)
        if b is None or mine is None or theirs == 0:
            out[r] = None
        elif theirs is None:
            out[r] = Ratio(mine / b.last_step, bound=True) if b.last_step else None
        else:
            out[r] = Ratio(mine / theirs, bound=False)
    return out


def _pair(r: RunResult) -> tuple:
    return (r.algorithm, r.mode, r.seed, r.lr, r.max_steps)


def _group(r: RunResult) -> tuple:
    """What a pair shares but the seed: the runs ``chance`` pools."""
    return (r.algorithm, r.mode, r.lr, r.max_steps)


def _name(r: RunResult, seed: bool = True) -> str:
    mode = "" if r.mode == "-" else f" {r.mode}"
    return f"{r.algorithm}{mode}{f' seed {r.seed}' if seed else ''} lr {r.lr:g} {r.max_steps} steps"


def chance(results: list[RunResult], max_ratio: float) -> list[tuple[str, int, float, int]]:
    """What the verdict can resolve: if a lag cost nothing, a lagged run's first step would be
    drawn like a ``k = 0`` run's, so the chance that one pair is within ``max_ratio`` is the
    share of ordered pairs ``(i, j)`` of distinct runs (every lag, pooled over the seeds given)
    with ``step_j <= max_ratio * step_i``; a run that never got there counts as infinitely
    late. Per pairing group (algorithm, mode, learning rate, max steps) with a lagged run:
    ``(name, runs pooled, chance per pair, lagged runs)``; ``p ** lagged`` is then the chance
    that every pair passes with no cost at all."""
    groups: dict[tuple, list[RunResult]] = {}
    for r in results:
        groups.setdefault(_group(r), []).append(r)
    out = []
    for runs in groups.values():
        lagged = sum(r.lag > 0 for r in runs)
        if not lagged or len(runs) < 2:
            continue
        steps = [r.first_step for r in runs]
        hits = sum(
            b is not None and (a is None or b <= max_ratio * a)
            for i, a in enumerate(steps)
            for j, b in enumerate(steps)
            if i != j
        )
        out.append(
            (_name(runs[0], seed=False), len(runs), hits / (len(runs) * (len(runs) - 1)), lagged)
        )
    return out


def report(results: list[RunResult], target: float, max_ratio: float, hold: int = 3) -> list[str]:
    """The table, one line per run (k = 0 before its lagged twins), the count on the held step,
    then the verdict (on the first step)."""
    rat, held = ratios(results), ratios(results, "held_step")
    results = sorted(results, key=lambda r: (*_pair(r), r.lag))
    lines = [f"{'algorithm':<9} {'mode':<9} {'lr':>7} {'seed':>4} {'k':>2} {'backend':<7} "
             f"{'eval':>5} {'step>=' + str(target):>9} {'ratio':>6} {'final':>6} {'steps':>6} "
             f"{'train_s':>8} {f'held x{hold}':>8} {'ratio':>6}  run"]  # fmt: skip
    for r in results:
        final = "-" if r.final_accuracy is None else f"{r.final_accuracy:.2f}"
        lines.append(f"{r.algorithm:<9} {r.mode:<9} {r.lr:>7g} {r.seed:>4} {r.lag:>2} "
                     f"{r.backend:<7} {r.eval_every:>5} {step_text(r.first_step):>9} "
                     f"{_ratio(r, rat):>6} {final:>6} {r.last_step:>6} {r.train_s:>8.0f} "
                     f"{step_text(r.held_step):>8} {_ratio(r, held):>6}  {r.run_dir}")  # fmt: skip
    within = [v is not None and v.value <= max_ratio for v in rat.values()]
    if not within:
        return [*lines, "no lagged run among these: nothing to compare (pass k>0 runs too)"]
    held_within = sum(v is not None and v.value <= max_ratio for v in held.values())
    lines.append(f"on the step held for {hold} evaluations: {held_within} of {len(within)} "
                 f"within {max_ratio}x")  # fmt: skip
    lines.append(f"lagged runs reaching {target} within {max_ratio}x the steps of k=0: "
                 f"{sum(within)} of {len(within)}"
                 + ("" if within and all(within) else " (target missed)"))  # fmt: skip
    return lines


def _ratio(r: RunResult, ratios: dict[RunResult, Ratio | None]) -> str:
    """Blank for a k = 0 run, ``-`` where no ratio exists, ``<x`` for a bound."""
    if r.lag == 0:
        return ""
    v = ratios[r]
    return "-" if v is None else ("<" if v.bound else "") + f"{v.value:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--target", type=float, default=0.9, help="held-out accuracy to reach")
    p.add_argument("--max-ratio", type=float, default=1.25, help="allowed step ratio k / k=0")
    p.add_argument(
        "--hold",
        type=int,
        default=3,
        help="the held column: evaluations in a row at the target (default 3)",
    )
    args = p.parse_args(argv)
    if args.hold < 1:
        raise SystemExit(f"lag_learning: --hold {args.hold}: give 1 or more evaluations in a row")
    results = [read_run(d, args.target, args.hold) for d in args.runs]
    print("\n".join(report(results, args.target, args.max_ratio, args.hold)))
    for name, pooled, p, lagged in chance(results, args.max_ratio):
        print(f"if the lag cost nothing ({name}: {pooled} runs' first steps pooled): a pair "
              f"within {args.max_ratio}x with chance {p:.2f}, {lagged} of {lagged} with "
              f"{p**lagged:.2f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
