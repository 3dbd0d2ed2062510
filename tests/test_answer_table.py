"""benchmarks/answer_table.py: every problem's greedy answer, grouped by the right answer."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import answer_table  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.config.serialize import to_yaml  # noqa: E402
from posttrain.model.tiny import build_tiny_model  # noqa: E402


def test_misses_are_grouped_by_answer_train_and_held_out_apart():
    rows = [("1+9=", "11", "10", False, False), ("2+8=", "10", "10", False, True),
            ("5+5=", "9", "10", True, False), ("0+0=", "", "0", True, False),
            ("3+4=", "7\n5", "7", False, True)]  # the verifier reads the first line  # fmt: skip
    assert answer_table.table(rows) == [
        "  wrong: 1/3 train, 2/2 held-out",
        "  1+9=11 (10), *5+5=9 (10), *0+0=(empty) (0)",
        "  answer  wrong/train  wrong/held-out",
        "       0      0/0           1/1",
        "      10      1/2           1/1",
    ]


def test_a_run_directory_is_answered_on_all_its_problems(tmp_path, capsys):
    run = tmp_path / "run"
    build_tiny_model("arith", run / "final_model", seed=0)
    config = load_config("arithmetic_clipped", ["--", f"model.name_or_path={run / 'final_model'}"])
    (run / "config.yaml").write_text(to_yaml(config))
    assert answer_table.main([str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{run} (final_model):"
    train, held = out[1].removeprefix("  wrong: ").split(", ")
    assert train.endswith("/80 train") and held.endswith("/20 held-out")
    wrong = int(train.split("/")[0]) + int(held.split("/")[0])
    by_answer = [line.split() for line in out[4:]]
    assert sum(int(w.split("/")[0]) + int(h.split("/")[0]) for _, w, h in by_answer) == wrong
