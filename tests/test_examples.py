"""The examples users copy from must keep running."""

from __future__ import annotations

import runpy
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_custom_objective_example_runs(capsys):
    ns = runpy.run_path(str(EXAMPLES / "custom_objective.py"))
    loss = ns["main"]()
    assert "bonus=" in capsys.readouterr().out
    assert loss == loss  # finite, not NaN


def test_loss_table_covers_every_variant_and_loss_type():
    ns = runpy.run_path(str(EXAMPLES / "loss_table.py"))
    rows = ns["rows"]()
    assert len(rows) == 4 * 4 + 1
    assert {r[0] for r in rows} >= {"GSPO sequence", "clipped dual (c=3)", "legacy_pg"}
