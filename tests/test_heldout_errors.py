"""benchmarks/heldout_errors.py: per-run wrong answers, and the problems every run gets wrong at
every late evaluation (a split's ceiling), over two hand-written runs of one held-out set."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import heldout_errors  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.config.serialize import to_yaml  # noqa: E402
from posttrain.control.data_checks import build_tasks  # noqa: E402


def fake_run(root: Path, name: str, wrong: dict[int, set[str]]) -> Path:
    """A run of ``arithmetic_clipped`` (seed 1's split) whose evaluation at each step of
    ``wrong`` answers those prompts one too high and the rest right."""
    cfg = load_config("arithmetic_clipped", ["--", "job.seed=1"])
    run = root / name
    (run / "samples").mkdir(parents=True)
    (run / "config.yaml").write_text(to_yaml(cfg))
    val = build_tasks(cfg).val_items()
    for step, bad in wrong.items():
        rows = []
        for it in val:
            given = str(int(it.answer) + 1) if it.prompt in bad else it.answer
            rows.append({"prompt": it.prompt, "answer": it.answer, "completion": given,
                         "correct": it.prompt not in bad})  # fmt: skip
        text = "".join(json.dumps(r) + "\n" for r in rows)
        (run / "samples" / f"step_{step:06d}.jsonl").write_text(text)
    return run


def test_a_problem_wrong_in_every_run_bounds_the_split(tmp_path, capsys):
    a = fake_run(tmp_path, "a", {1000: {"1+2=", "0+0="}, 2000: {"0+0=", "5+5="}, 3000: {"0+0="}})
    b = fake_run(tmp_path, "b", {2000: {"0+0=", "7+2="}, 3000: {"0+0=", "7+2="}})
    assert heldout_errors.main([str(a), str(b), "--from-step", "2000"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "a: step 3000: 19/20 right; wrong: 0+0=1 (0)"
    assert out[1] == "b: step 3000: 18/20 right; wrong: 7+2=10 (9), 0+0=1 (0)"  # split order
    rows = {line.split()[0]: line.split() for line in out if line.startswith("  ") and "=" in line}
    # answer, train problems with it, runs wrong at every evaluation from step 2000 (1+2 was
    # wrong at 1000 only: not listed)
    assert rows["0+0="][1:5] == ["0", "0", "2", "of"]
    assert rows["7+2="][1:4] == ["9", "8", "1"] and rows["5+5="][1:4] == ["10", "8", "0"]
    assert "1+2=" not in rows
    assert out[-1].strip().startswith("ceiling: 19/20 = 0.95 (1 problem(s)")
