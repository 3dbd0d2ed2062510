"""Metric sinks. ``metrics.jsonl`` is the record of a run (one JSON object per step, stable
names); TensorBoard and W&B are optional views of the same numbers."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from posttrain.fileio import atomic_write_text


class MetricsFileError(ValueError):
    """``metrics.jsonl`` is damaged in a way resume cannot repair (a bad line before the last)."""


class MetricSink(Protocol):
    def write(self, step: int, metrics: Mapping[str, float]) -> None: ...
    def close(self) -> None: ...


def _plain(metrics: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        v = float(v.item() if hasattr(v, "item") else v)
        out[k] = v if math.isfinite(v) else None
    return out


def _complete_lines(path: Path) -> list[str]:
    """The file's JSON lines; a torn last line (a crash mid-write) is dropped, a torn line
    elsewhere is an error naming it."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    for i, line in enumerate(lines):
        try:
            json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                return lines[:-1]
            raise MetricsFileError(
                f"{path}:{i + 1} is not valid JSON; the metrics file is damaged (move it aside)"
            ) from None
    return lines


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The step records of a ``metrics.jsonl`` (a torn last line, as in a live run, is left out)."""
    return [json.loads(line) for line in _complete_lines(Path(path))]


class JsonlSink:
    """Append-only, one fsynced line per step. On resume, lines past the resumed step (and a torn
    last line) are dropped by writing the kept lines to a temp file that is renamed over the old
    one, so a kill at any moment leaves either the old history or the trimmed one, never less."""

    def __init__(self, path: str | os.PathLike, resume_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            kept = [
                line
                for line in _complete_lines(self.path)
                if json.loads(line)["step"] <= resume_step
            ]
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        self._f = self.path.open("a")

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        self._f.write(json.dumps({"step": step, **_plain(metrics)}, sort_keys=True) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


class TensorBoardSink:
    def __init__(self, log_dir: str | os.PathLike) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "logging.tensorboard=true needs the tensorboard package: pip install 'posttrain[tracking]'"
            ) from e
        self._w = SummaryWriter(log_dir=str(log_dir))

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        for k, v in _plain(metrics).items():
            if v is not None:
                self._w.add_scalar(k, v, step)
        self._w.flush()

    def close(self) -> None:
        self._w.close()


class WandbSink:
    """W&B in ``online``, ``offline`` (files only, sync later) or ``disabled`` mode."""

    def __init__(
        self, out_dir: str | os.PathLike, project: str, name: str, mode: str, config: dict
    ):
        try:
            import wandb
        except ImportError as e:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "logging.wandb=true needs the wandb package: pip install 'posttrain[tracking]'"
            ) from e
        self._run = wandb.init(
            project=project, name=name, mode=mode, dir=str(out_dir), config=config, reinit=True
        )

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        self._run.log({k: v for k, v in _plain(metrics).items() if v is not None}, step=step)

    def close(self) -> None:
        self._run.finish()


class _Fanout:
    def __init__(self, sinks: list[MetricSink]) -> None:
        self.sinks = sinks

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        for s in self.sinks:
            s.write(step, metrics)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def open_sinks(
    out_dir: str | os.PathLike,
    *,
    resume_step: int | None = None,
    tensorboard: bool = False,
    wandb: bool = False,
    wandb_project: str = "posttrain",
    wandb_mode: str = "offline",
    run_name: str = "run",
    config: dict | None = None,
) -> MetricSink:
    out = Path(out_dir)
    sinks: list[MetricSink] = [JsonlSink(out / "metrics.jsonl", resume_step)]
    if tensorboard:
        sinks.append(TensorBoardSink(out / "tensorboard"))
    if wandb:
        sinks.append(WandbSink(out, wandb_project, run_name, wandb_mode, config or {}))
    return _Fanout(sinks)
