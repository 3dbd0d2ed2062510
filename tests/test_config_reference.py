"""docs/reference/config.md is generated from the schema and the rules, and must be current."""

from __future__ import annotations

from pathlib import Path

from posttrain.config import all_keys, migration_lines
from posttrain.control import RULES
from posttrain.control.reference import main, render

DOC = Path(__file__).resolve().parent.parent / "docs" / "reference" / "config.md"


def test_reference_is_not_stale():
    assert DOC.is_file(), "docs/reference/config.md is missing; run `make docs`"
    assert DOC.read_text() == render(), "docs/reference/config.md is stale; run `make docs`"


def test_reference_lists_every_key_rule_and_migration():
    text = render()
    for key in all_keys():
        assert f"| `{key}` |" in text, key
    for rule in RULES:
        assert f"| `{rule.name}` |" in text, rule.name
    for line in migration_lines():
        old, new = line.split(" -> ")
        assert f"| `{old}` | `{new}` |" in text


def test_reference_rows_name_the_rules_reading_each_key():
    row = next(
        line for line in render().splitlines() if line.startswith("| `rl.lower_bound_ratio`")
    )
    assert "`objective_reads_its_knobs`" in row and "`entry_reads_no_online_knobs`" in row
    assert "\\|A\\|" in row  # pipes in descriptions are escaped so the table stays intact
    row = next(line for line in render().splitlines() if line.startswith("| `rl.lr`"))
    assert row.endswith("| - |")


def test_check_mode_detects_staleness(tmp_path, capsys):
    path = tmp_path / "config.md"
    assert main([str(path), "--check"]) == 1
    assert main([str(path)]) == 0
    assert main([str(path), "--check"]) == 0
    path.write_text(path.read_text() + "edit\n")
    assert main([str(path), "--check"]) == 1
    assert "stale; run `make docs`" in capsys.readouterr().err
