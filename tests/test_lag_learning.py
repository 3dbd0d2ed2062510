"""benchmarks/lag_learning.py on fabricated run directories: first step at the target, the
k / k=0 ratio per (algorithm, seed), the verdict, and its one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from posttrain.config import PosttrainConfig
from posttrain.config.serialize import to_yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import lag_learning  # noqa: E402


def fake_run(root: Path, name: str, seed: int, lag: int, accs: dict[int, float],
             algorithm: str = "grpo", steps: int = 0, lr: float = 1e-3,
             mode: str = "advantage", max_steps: int = 500) -> str:  # fmt: skip
    """A run directory: config.yaml with these keys, val/accuracy at the steps of ``accs``, and
    one training record (time/step_s = 0.5) per step 1..``steps``."""
    cfg = PosttrainConfig()
    cfg.job.algorithm, cfg.job.seed, cfg.rl.off_policy_lag = algorithm, seed, lag
    cfg.rl.lr, cfg.rl.distillation_mode, cfg.rl.max_steps = lr, mode, max_steps
    cfg.placement.backend = "ray" if lag else "local"
    cfg.rl.eval_every = 100
    run = root / name
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(cfg))
    rows = {s: {"step": s, "time/step_s": 0.5} for s in range(1, steps + 1)}
    for s, acc in accs.items():
        rows.setdefault(s, {"step": s})["val/accuracy"] = acc
    text = "".join(json.dumps(rows[s]) + "\n" for s in sorted(rows))
    (run / "metrics.jsonl").write_text(text)
    return str(run)


def test_first_step_final_accuracy_and_step_time(tmp_path):
    run = fake_run(tmp_path, "a", 0, 0, {0: 0.0, 100: 0.85, 200: 0.9, 300: 0.95, 400: 0.8},
                   steps=400)  # fmt: skip
    r = lag_learning.read_run(run, 0.9)
    assert (r.first_step, r.final_accuracy, r.last_step) == (200, 0.8, 400)
    assert r.train_s == 200.0 and (r.seed, r.lag, r.backend, r.eval_every) == (0, 0, "local", 100)
    assert lag_learning.read_run(run, 0.96).first_step is None


def test_ratio_pairs_each_lagged_run_with_its_own_seed(tmp_path):
    runs = [
        fake_run(tmp_path, "s0k0", 0, 0, {100: 0.5, 400: 0.9}),
        fake_run(tmp_path, "s0k1", 0, 1, {100: 0.5, 500: 0.95}),  # 500 / 400
        fake_run(tmp_path, "s1k0", 1, 0, {200: 0.9}),
        fake_run(tmp_path, "s1k1", 1, 1, {100: 0.9}),  # faster: 100 / 200
        fake_run(tmp_path, "opd0", 0, 0, {25: 0.9}, algorithm="opd"),  # same seed, other algorithm
        fake_run(tmp_path, "opd1", 0, 1, {50: 0.9}, algorithm="opd"),
    ]
    got = {(r.algorithm, r.seed): v for r, v in
           lag_learning.ratios([lag_learning.read_run(d, 0.9) for d in runs]).items()}  # fmt: skip
    assert got == {("grpo", 0): (1.25, False), ("grpo", 1): (0.5, False), ("opd", 0): (2.0, False)}


def test_runs_pair_by_learning_rate_and_opd_mode(tmp_path):
    """One seed's OPD runs at two learning rates, in both modes and at two lengths: each lagged
    run meets the k=0 run of its own rate, mode and max steps, and the table names them."""
    runs = [
        fake_run(tmp_path, "a3k0", 0, 0, {400: 0.9}, algorithm="opd", lr=3e-3),
        fake_run(tmp_path, "a3k1", 0, 1, {600: 0.9}, algorithm="opd", lr=3e-3),  # 600 / 400
        fake_run(tmp_path, "a2k0", 0, 0, {200: 0.9}, algorithm="opd", lr=2e-3),
        fake_run(tmp_path, "a2k1", 0, 1, {500: 0.9}, algorithm="opd", lr=2e-3),  # 500 / 200
        fake_run(tmp_path, "d3k0", 0, 0, {100: 0.9}, algorithm="opd", lr=3e-3, mode="direct"),
        fake_run(tmp_path, "d3k1", 0, 1, {300: 0.9}, algorithm="opd", lr=3e-3, mode="direct"),
        fake_run(tmp_path, "g", 0, 0, {100: 0.9}, lr=3e-3, mode="direct"),  # GRPO: no mode
        fake_run(tmp_path, "long", 0, 1, {900: 0.9}, algorithm="opd", lr=3e-3, max_steps=1000),
    ]
    results = [lag_learning.read_run(d, 0.9) for d in runs]
    got = {(r.mode, r.lr, r.max_steps): v and v.value
           for r, v in lag_learning.ratios(results).items()}  # fmt: skip
    assert got == {("advantage", 3e-3, 500): 1.5, ("advantage", 2e-3, 500): 2.5,
                   ("direct", 3e-3, 500): 3.0, ("advantage", 3e-3, 1000): None}  # fmt: skip
    by_run = {line.split()[-1]: line.split() for line in lag_learning.report(results, 0.9, 2)[1:]}
    assert by_run[runs[3]][:5] == ["opd", "advantage", "0.002", "0", "1"]
    assert by_run[runs[6]][:3] == ["grpo", "-", "0.003"]


def test_verdict_counts_runs_within_the_ratio_and_flags_a_miss(tmp_path):
    runs = [
        fake_run(tmp_path, "s0k0", 0, 0, {400: 0.9}),
        fake_run(tmp_path, "s0k1", 0, 1, {500: 0.9}),  # 1.25: within (the bound is inclusive)
        fake_run(tmp_path, "s1k0", 1, 0, {400: 0.9}),
        fake_run(tmp_path, "s1k1", 1, 1, {600: 0.9}),  # 1.5: outside
        fake_run(tmp_path, "s2k0", 2, 0, {400: 0.9}),
        fake_run(tmp_path, "s2k1", 2, 1, {400: 0.85}),  # never reached: no ratio
    ]
    lines = lag_learning.report([lag_learning.read_run(d, 0.9) for d in runs], 0.9, 1.25)
    assert lines[-1] == ("lagged runs reaching 0.9 within 1.25x the steps of k=0: 1 of 3 "
                         "(target missed)")  # fmt: skip
    by_run = {line.split()[-1]: line.split() for line in lines[1:-2]}
    assert by_run[runs[1]][7:9] == ["500", "1.25"]
    assert by_run[runs[3]][7:9] == ["600", "1.50"]
    assert by_run[runs[5]][7:9] == ["never", "-"]
    assert [line.split()[-1] for line in lines[1:-2]] == runs  # k=0 first, then its twin


def test_held_step_needs_the_target_in_a_row_and_has_its_own_ratio(tmp_path):
    """A first step that is one lucky evaluation (k = 0 at 200, then 0.7) gives a ratio of 2.0;
    held for three evaluations, k = 0 is at 500 and the lagged run at 400: 0.8. The verdict
    stays the first step's, the held count is the line before it."""
    k0 = {100: 0.5, 200: 0.9, 300: 0.7, 400: 0.85, 500: 0.9, 600: 0.95, 700: 0.9, 800: 0.9}
    k1 = {100: 0.5, 200: 0.6, 300: 0.8, 400: 0.9, 500: 0.9, 600: 1.0, 700: 0.85, 800: 0.9}
    runs = [fake_run(tmp_path, "k0", 0, 0, k0), fake_run(tmp_path, "k1", 0, 1, k1)]
    results = [lag_learning.read_run(d, 0.9) for d in runs]
    assert [(r.first_step, r.held_step) for r in results] == [(200, 500), (400, 400)]
    assert [r.held_step for r in (lag_learning.read_run(d, 0.9, hold=1) for d in runs)] == [
        200, 400]  # fmt: skip
    assert lag_learning.read_run(runs[1], 0.9, hold=4).held_step is None  # 700 breaks the run
    lines = lag_learning.report(results, 0.9, 1.25)
    assert lines[0].split()[-4:] == ["held", "x3", "ratio", "run"]
    assert lines[2].split()[7:9] == ["400", "2.00"] and lines[2].split()[-3:-1] == ["400", "0.80"]
    assert lines[1].split()[-2:] == ["500", runs[0]]  # k = 0: no ratio
    assert lines[-2:] == [
        "on the step held for 3 evaluations: 1 of 1 within 1.25x",
        "lagged runs reaching 0.9 within 1.25x the steps of k=0: 0 of 1 (target missed)",
    ]
    with pytest.raises(SystemExit, match=r"^lag_learning: --hold 0: give 1 or more"):
        lag_learning.main([*runs, "--hold", "0"])


def test_a_lagged_run_that_gets_there_where_k0_never_does_is_within_a_bound(tmp_path):
    """k = 0 never reaches 0.9 in its 3,000 steps, the lagged run does at 2,000: the ratio is
    below 2,000 / 3,000, shown ``<0.67`` and counted within; a lagged run that never gets there
    has no ratio, whatever its twin did."""
    runs = [
        fake_run(tmp_path, "s0k0", 0, 0, {1000: 0.8, 3000: 0.75}, steps=3000, max_steps=3000),
        fake_run(tmp_path, "s0k1", 0, 1, {1000: 0.8, 2000: 0.9, 3000: 0.85}, max_steps=3000),
        fake_run(tmp_path, "s1k0", 1, 0, {1000: 0.8}, steps=3000, max_steps=3000),
        fake_run(tmp_path, "s1k1", 1, 1, {1000: 0.8}, max_steps=3000),
    ]
    results = [lag_learning.read_run(d, 0.9) for d in runs]
    got = {r.seed: v for r, v in lag_learning.ratios(results).items()}
    assert got[0] == (2000 / 3000, True) and got[1] is None
    lines = lag_learning.report(results, 0.9, 1.25)
    assert lines[2].split()[7:9] == ["2000", "<0.67"]
    assert lines[-1] == ("lagged runs reaching 0.9 within 1.25x the steps of k=0: 1 of 2 "
                         "(target missed)")  # fmt: skip


def test_all_within_has_no_miss_note(tmp_path, capsys):
    runs = [fake_run(tmp_path, "k0", 0, 0, {400: 0.9}), fake_run(tmp_path, "k1", 0, 1, {300: 0.9})]
    assert lag_learning.main(runs) == 0
    assert capsys.readouterr().out.splitlines()[-2].endswith("k=0: 1 of 1")


def test_not_a_run_directory_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        lag_learning.main([str(tmp_path)])
    assert str(e.value) == (f"lag_learning: {tmp_path} has no config.yaml; pass run "
                            "directories (outputs/<algorithm>/<job.name>)")  # fmt: skip


def test_two_runs_of_one_seed_and_lag_are_refused(tmp_path):
    a = fake_run(tmp_path, "a", 3, 1, {100: 0.9})
    b = fake_run(tmp_path, "b", 3, 1, {200: 0.9})
    with pytest.raises(
        SystemExit, match=r"lag_learning: .*/a and .*/b are both grpo seed 3 lr 0.001 500 steps k=1"
    ):
        lag_learning.main([a, b])
    c = fake_run(tmp_path, "c", 3, 1, {100: 0.9}, algorithm="opd", lr=3e-3)
    d = fake_run(tmp_path, "d", 3, 1, {100: 0.9}, algorithm="opd", lr=3e-3)
    with pytest.raises(
        SystemExit, match=r"are both opd advantage seed 3 lr 0.003 500 steps k=1; pass"
    ):
        lag_learning.main([c, d])


def test_without_a_lagged_run_the_verdict_says_so(tmp_path):
    lines = lag_learning.report([lag_learning.read_run(fake_run(tmp_path, "k0", 0, 0, {4: 0.9}),
                                                       0.9)], 0.9, 1.25)  # fmt: skip
    assert lines[-1] == "no lagged run among these: nothing to compare (pass k>0 runs too)"


def test_chance_pools_first_steps_as_draws_of_one_distribution(tmp_path, capsys):
    """Steps 400, 500, 200, 100 and one run that never gets there: of the 20 ordered pairs
    (i, j), j within 1.25x of i on 11 (hand-counted: from 400 three, from 500 three, from 200
    one (100), from 100 none, from never all four; never itself none)."""
    runs = [
        fake_run(tmp_path, "s0k0", 0, 0, {400: 0.9}),
        fake_run(tmp_path, "s0k1", 0, 1, {500: 0.9}),
        fake_run(tmp_path, "s1k0", 1, 0, {200: 0.9}),
        fake_run(tmp_path, "s1k1", 1, 1, {100: 0.9}),
        fake_run(tmp_path, "s2k1", 2, 1, {100: 0.5}),
        fake_run(tmp_path, "opd", 0, 0, {25: 0.9}, algorithm="opd"),  # no lagged twin: no group
    ]
    results = [lag_learning.read_run(d, 0.9) for d in runs]
    [(name, pooled, p, lagged)] = lag_learning.chance(results, 1.25)
    assert (name, pooled, lagged) == ("grpo lr 0.001 500 steps", 5, 3)
    assert p == pytest.approx(11 / 20)
    assert lag_learning.main(runs) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "if the lag cost nothing (grpo lr 0.001 500 steps: 5 runs' first steps pooled): a pair "
        "within 1.25x with chance 0.55, 3 of 3 with 0.17"
    )
