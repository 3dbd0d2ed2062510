"""Run one recipe over seeds and tabulate what each reached: a learning claim is a table of seeds.

    python benchmarks/seeds.py RECIPE [--seeds 0 1 2] [--parallel 2] [--target 0.9]
        [--metric val/accuracy] [--entry grpo|opd] [--name BASE] [-- OVERRIDES ...]

Each seed ``k`` is its own ``posttrain grpo|opd --config RECIPE -- OVERRIDES job.seed=k
job.name=BASE_seedk`` subprocess (one torch thread each, ``--parallel`` at a time), so it has its
own run directory, resume and log (``OUTPUT_ROOT/sweeps/BASE_seedk.log``). Where the recipe builds
its initial model (``model.init_preset``, seeded by ``job.seed``) each seed gets its own,
``model.name_or_path`` + ``_seedk``: the initial weights vary with the seed too.

``--kernels avx2`` runs every seed with the CPU kernels an AVX2-only machine takes (torch's
``ATEN_CPU_CAPABILITY``, MKL's and oneDNN's instruction limits), so one machine shows the other
kind's rounding: a sweep on an AVX-512 machine with ``--kernels avx2`` gave a 2-core AVX2 EPYC's
``arithmetic_clipped`` table step for step. Without ``--name`` its runs are ``BASE_avx2_seedk``.

Resumable: a seed whose run is complete (its checkpoint at ``rl.max_steps``, written after the
final evaluation, is marked complete) is not run again; its numbers are read from its
``metrics.jsonl``. A seed stopped midway resumes from its last checkpoint (``rl.resume=auto``).

The table: per seed the first evaluation step with the metric >= ``--target`` (``never``), the
first step from which it stays there for ``--hold`` evaluations in a row (``held x3``: one
evaluation of 20 held-out problems can pass 0.9 and the next fall to 0.7), the final value, the
steps recorded and ``train_s`` (the sum of ``time/step_s``: the steps alone, no evaluation or
start-up; it depends on the machine's load), then the median and the worst.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from posttrain.config import ConfigError, load_config
from posttrain.config.schema import objective_family
from posttrain.metrics.sinks import read_metrics
from posttrain.run.records import default_out_dir
from posttrain.trainer.manifest import COMPLETE

#: ``--kernels``: the environment each seed's process gets (the libraries' own switches).
KERNELS: dict[str, dict[str, str]] = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "ONEDNN_MAX_CPU_ISA": "AVX2"},
}  # fmt: skip


@dataclass(frozen=True)
class Seed:
    seed: int
    opts: tuple[str, ...]
    run_dir: Path
    max_steps: int
    kernels: str = "native"  # a key of KERNELS: the environment its process gets


@dataclass(frozen=True)
class SeedResult:
    seed: int
    status: str  # "ran", "skipped (complete)" or "failed (exit N, see LOG)"
    first_step: int | None
    held_step: int | None  # first step from which the metric stays >= target (see first_held)
    final: float | None
    steps: int
    train_s: float
    run_dir: str


def plan(
    recipe: str, seeds: list[int], name: str | None, overrides: list[str], kernels: str = "native"
) -> list[Seed]:
    """Each seed's overrides and run directory, from the recipe resolved with them."""
    base_cfg = load_config(recipe, ["--", *overrides])
    base = name or base_cfg.job.name + ("" if kernels == "native" else f"_{kernels}")
    out = []
    for k in seeds:
        opts = [*overrides, f"job.seed={k}", f"job.name={base}_seed{k}"]
        if base_cfg.model.init_preset:  # the initial model is built from job.seed: one per seed
            opts.append(f"model.name_or_path={base_cfg.model.name_or_path}_seed{k}")
        if not any(o.startswith("placement.torch_threads_per_process=") for o in overrides):
            opts.append("placement.torch_threads_per_process=1")
        cfg = load_config(recipe, ["--", *opts])
        out.append(Seed(k, tuple(opts), default_out_dir(cfg), cfg.rl.max_steps, kernels))
    return out


def first_held(evals: list[tuple[int, float]], target: float, hold: int) -> int | None:
    """The first evaluation step from which the value stays >= ``target`` for ``hold``
    evaluations in a row (that one included); None if no such run of evaluations.

    The first step at the target alone is a minimum over a noisy curve: on 20 held-out problems
    one evaluation can reach 0.9 and the next fall to 0.7. Held for a few evaluations, it says
    when the policy got there rather than when it first passed by."""
    for i in range(len(evals) - hold + 1):
        if all(v >= target for _, v in evals[i : i + hold]):
            return evals[i][0]
    return None


def read_result(seed: Seed, metric: str, target: float, status: str, hold: int = 3) -> SeedResult:
    path = seed.run_dir / "metrics.jsonl"
    rows = read_metrics(path) if path.is_file() else []
    evals = [(int(r["step"]), float(r[metric])) for r in rows if metric in r]
    return SeedResult(
        seed=seed.seed,
        status=status,
        first_step=first_held(evals, target, 1),
        held_step=first_held(evals, target, hold),
        final=evals[-1][1] if evals and evals[-1][0] == seed.max_steps else None,
        steps=max((int(r["step"]) for r in rows), default=0),
        train_s=sum(float(r.get("time/step_s", 0.0)) for r in rows),
        run_dir=str(seed.run_dir),
    )


def complete(seed: Seed) -> bool:
    """The run is complete: its checkpoint at ``rl.max_steps`` (saved after the step's record
    and its final evaluation) is marked complete."""
    return (seed.run_dir / "checkpoints" / f"step_{seed.max_steps:08d}" / COMPLETE).is_file()


def run_seed(seed: Seed, recipe: str, entry: str, log_dir: Path) -> str:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{seed.run_dir.name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **KERNELS[seed.kernels]}
    cmd = [sys.executable, "-m", "posttrain.entrypoints.cli", entry, "--config", recipe, "--",
           *seed.opts]  # fmt: skip
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    return "ran" if rc == 0 else f"failed (exit {rc}, see {log})"


def sweep(recipe: str, seeds: list[Seed], entry: str, metric: str, target: float,
          parallel: int, log_dir: Path, hold: int = 3) -> list[SeedResult]:  # fmt: skip
    """Run the seeds not complete yet, ``parallel`` at a time; every seed's result."""
    status = {s.seed: "skipped (complete)" for s in seeds if complete(s)}
    todo = [s for s in seeds if s.seed not in status]
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        runs = pool.map(lambda s: run_seed(s, recipe, entry, log_dir), todo)
        for s, st in zip(todo, runs, strict=True):
            status[s.seed] = st
    return [read_result(s, metric, target, status[s.seed], hold) for s in seeds]


def step_text(step: int | None) -> str:
    """A first step as the tables show it."""
    return "never" if step is None else str(step)


def _value(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def table(results: list[SeedResult], metric: str, target: float, hold: int = 3) -> list[str]:
    """One line per seed, then the median and the worst (a seed that never reached the target
    counts as the latest; a seed without a final evaluation as the lowest)."""
    head = f"step {metric}>={target:g}"
    held = f"held x{hold}"
    lines = [f"{'seed':>6} {head:>26} {held:>8} {'final':>6} {'steps':>6} {'train_s':>8}  status"]
    for r in results:
        lines.append(f"{r.seed:>6} {step_text(r.first_step):>26} {step_text(r.held_step):>8} "
                     f"{_value(r.final):>6} {r.steps:>6} {r.train_s:>8.0f}  {r.status}")  # fmt: skip
    inf = float("inf")
    firsts = [inf if r.first_step is None else r.first_step for r in results]
    helds = [inf if r.held_step is None else r.held_step for r in results]
    finals = [-inf if r.final is None else r.final for r in results]
    times = [r.train_s for r in results]

    def shown(x: float, kind: str) -> str:
        if kind == "step":
            return "never" if x == inf else f"{x:g}"
        return "-" if x == -inf else f"{x:.2f}"

    med = (statistics.median_low(firsts), statistics.median_low(helds),
           statistics.median_low(finals), statistics.median(times))  # fmt: skip
    worst = (max(firsts), max(helds), min(finals), max(times))
    for label, (f, h, v, t) in (("median", med), ("worst", worst)):
        lines.append(f"{label:>6} {shown(f, 'step'):>26} {shown(h, 'step'):>8} "
                     f"{shown(v, 'value'):>6} {'':>6} {t:>8.0f}")  # fmt: skip
    reached = sum(r.first_step is not None for r in results)
    lines.append(f"{reached} of {len(results)} seeds reached {metric} >= {target:g}")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    overrides: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, overrides = argv[:i], argv[i + 1:]  # fmt: skip
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe", help="a built-in recipe name or a recipe/config file")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="job.seed values")
    p.add_argument("--parallel", type=int, default=2, help="seeds run at a time (default 2)")
    p.add_argument("--target", type=float, default=0.9, help="value of --metric to reach")
    p.add_argument("--metric", default="val/accuracy", help="evaluation metric (val/accuracy)")
    p.add_argument(
        "--hold",
        type=int,
        default=3,
        help="the held column: evaluations in a row at the target (default 3)",
    )
    p.add_argument("--entry", choices=("grpo", "opd"), help="default: the recipe's family")
    p.add_argument("--name", help="job.name base (default: the recipe's job.name)")
    p.add_argument("--kernels", choices=tuple(KERNELS), default="native",
                   help="CPU kernels: native, or those of an AVX2-only machine")  # fmt: skip
    args = p.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds):
        raise SystemExit(f"seeds: --seeds {args.seeds} repeats a seed; name each once")
    if args.hold < 1:
        raise SystemExit(f"seeds: --hold {args.hold}: give 1 or more evaluations in a row")
    try:
        seeds = plan(args.recipe, args.seeds, args.name, overrides, args.kernels)
        cfg = load_config(args.recipe, ["--", *overrides])
    except ConfigError as e:
        raise SystemExit(f"seeds: {e}") from None
    entry = args.entry or objective_family(cfg)
    if entry == "dpo":
        raise SystemExit(f"seeds: {args.recipe} is a DPO recipe; the sweep runs grpo or opd")
    log_dir = Path(cfg.job.output_root) / "sweeps"
    results = sweep(args.recipe, seeds, entry, args.metric, args.target, args.parallel, log_dir,
                    args.hold)  # fmt: skip
    print("\n".join(table(results, args.metric, args.target, args.hold)))
    return 0 if all(not r.status.startswith("failed") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
