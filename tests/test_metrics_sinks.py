"""Metric sinks."""

from __future__ import annotations

import json

import pytest

from posttrain.metrics import open_sinks
from posttrain.metrics.sinks import MetricsFileError


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
    open_sinks(tmp_path, resume_step=2).close()
    assert [r["step"] for r in _rows(path)] == [1]
    path.write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    with pytest.raises(MetricsFileError, match="metrics.jsonl:2"):
        open_sinks(tmp_path, resume_step=3)
