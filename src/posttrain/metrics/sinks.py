"""Metric sinks. ``metrics.jsonl`` is the record of a run (one JSON object per step, stable
names); TensorBoard and W&B are optional views of the same numbers."""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from posttrain.fileio import atomic_write_text

#: The run's record in its run directory: one JSON object per step.
METRICS_FILE = "metrics.jsonl"


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


def _records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The file's step records with their lines. A torn last line (a crash mid-write) is dropped;
    a line that is not JSON elsewhere, or valid JSON that is not a step record (an object with an
    integer ``step``), is an error naming the file and line."""
    numbered = [
        (i, line) for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip()
    ]
    out = []
    for k, (i, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if k == len(numbered) - 1:
                break
            raise MetricsFileError(
                f"{path}:{i} is not valid JSON; the metrics file is damaged (move it aside)"
            ) from None
        step = record.get("step") if isinstance(record, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            shown = line if len(line) <= 40 else line[:37] + "..."
            raise MetricsFileError(
                f'{path}:{i} is not a step record (a JSON object with an integer "step"): '
                f"{shown}; the metrics file is damaged (remove that line or move the file aside)"
            )
        out.append((line, record))
    return out


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The step records of a ``metrics.jsonl`` (a torn last line, as in a live run, is left out);
    the one reader of the file, for resume and for ``posttrain plot``."""
    return [record for _, record in _records(Path(path))]


def missing_steps(steps: list[int], upto: int) -> list[int]:
    """Steps ``1..upto`` that a history lacks (step 0, the evaluation before training, is
    optional)."""
    have = set(steps)
    return [s for s in range(1, upto + 1) if s not in have]


def _ranges(steps: list[int]) -> str:
    parts, first = [], None
    for i, s in enumerate(steps):
        first = s if first is None else first
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            parts.append(str(s) if first == s else f"{first}-{s}")
            first = None
    return ", ".join(parts)


class JsonlSink:
    """Append-only, one fsynced line per step. On resume, lines past the resumed step (and a torn
    last line) are dropped by writing the kept lines to a temp file that is renamed over the old
    one, so a kill at any moment leaves either the old history or the trimmed one, never less."""

    def __init__(self, path: str | os.PathLike, resume_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            kept = []
            if self.path.exists():
                kept = [(ln, r) for ln, r in _records(self.path) if r["step"] <= resume_step]
                atomic_write_text(self.path, "".join(ln + "\n" for ln, _ in kept))
            gap = missing_steps([r["step"] for _, r in kept], resume_step)
            if gap:
                # The steps are in the checkpoint's weights but not in the record: say so once,
                # so a curve with a hole is never mistaken for the whole run.
                warnings.warn(
                    f"{self.path} lacks steps {_ranges(gap)} of the {resume_step} steps the "
                    f"checkpoint holds (the file was truncated or replaced); the run resumes "
                    f"from step {resume_step + 1} and those steps' metrics stay missing",
                    stacklevel=2,
                )
        elif self.path.exists():
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
    sinks: list[MetricSink] = [JsonlSink(out / METRICS_FILE, resume_step)]
    if tensorboard:
        sinks.append(TensorBoardSink(out / "tensorboard"))
    if wandb:
        sinks.append(WandbSink(out, wandb_project, run_name, wandb_mode, config or {}))
    return _Fanout(sinks)
