"""Metric sinks."""

from __future__ import annotations

import json

import pytest

from posttrain.metrics import open_sinks
from posttrain.metrics.sinks import MetricsFileError, read_metrics


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_jsonl_one_object_per_step_and_resume_truncates(tmp_path):
    sink = open_sinks(tmp_path)
    for step in range(1, 5):
        sink.write(step, {"train/loss": 1.0 / step, "val/accuracy": float("nan")})
    sink.close()
    rows = _rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["val/accuracy"] is None  # non-finite values are written as null
    # A resume from step 2 drops steps 3-4 written after that checkpoint.
    sink = open_sinks(tmp_path, resume_step=2)
    sink.write(3, {"train/loss": 9.0})
    sink.close()
    assert [r["step"] for r in _rows(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    # A fresh start never appends to an old file.
    open_sinks(tmp_path).close()
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_tensorboard_sink_writes_events(tmp_path):
    pytest.importorskip("tensorboard")
    sink = open_sinks(tmp_path, tensorboard=True)
    sink.write(1, {"train/loss": 0.5})
    sink.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_wandb_offline_needs_no_network(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = open_sinks(tmp_path, wandb=True, wandb_mode="offline", run_name="t", config={"a": 1})
    sink.write(1, {"train/loss": 0.5})
    sink.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_resume_drops_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 1.0}\n{"step": 2, "train/lo')
    open_sinks(tmp_path, resume_step=1).close()  # the torn step was never saved
    assert [r["step"] for r in _rows(path)] == [1]
    path.write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    with pytest.raises(MetricsFileError, match="metrics.jsonl:2"):
        open_sinks(tmp_path, resume_step=3)


def test_resume_says_which_steps_a_truncated_history_lacks(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(f'{{"step": {s}}}\n' for s in (0, 1, 2, 3, 4, 7)))
    with pytest.warns(UserWarning, match=r"lacks steps 5-6, 8-9 of the 9 steps the checkpoint"):
        open_sinks(tmp_path, resume_step=9).close()
    assert [r["step"] for r in _rows(path)] == [0, 1, 2, 3, 4, 7]  # kept, not invented
    path.unlink()
    with pytest.warns(UserWarning, match="lacks steps 1-3 of the 3 steps"):
        open_sinks(tmp_path, resume_step=3).close()


@pytest.mark.parametrize(
    "line", ['{"note": "hi"}', "123", "null", '{"step": "3"}', '{"step": true}']
)
def test_a_json_line_that_is_not_a_step_record_is_named(tmp_path, line):
    path = tmp_path / "metrics.jsonl"
    path.write_text(f'{{"step": 1}}\n\n{line}\n{{"step": 2}}\n')
    with pytest.raises(MetricsFileError, match=r"metrics.jsonl:3 is not a step record") as e:
        read_metrics(path)
    assert "\n" not in str(e.value)
    with pytest.raises(MetricsFileError, match=r"metrics.jsonl:3 is not a step record"):
        open_sinks(tmp_path, resume_step=2)


def test_plot_names_a_line_that_is_not_a_step_record(tmp_path, capsys):
    from posttrain.entrypoints.cli import main

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\nnull\n{"step": 2}\n')
    assert main(["plot", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "metrics.jsonl:2 is not a step record" in err, err
