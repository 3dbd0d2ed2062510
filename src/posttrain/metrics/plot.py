"""``posttrain plot RUN [RUN ...]``: curves from ``metrics.jsonl``, one panel per metric, the runs
overlaid with a legend.

Without ``--metrics`` the panels are what a researcher looks at first -- reward, held-out
accuracy, loss, KL, clip fractions, response length -- followed by the objective's own metrics
(every ``train/<namespace>/<name>`` key, e.g. GRPO's ``train/pg/*``), so a new objective's
statistics appear without editing this file. ``--metrics`` takes names or shell-style globs over
the keys of ``metrics.jsonl``. ``--smooth ema:0.9`` or ``--smooth window:10`` draws a smoothed
line over the faint raw one.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.config.errors import listing
from posttrain.metrics.sinks import read_metrics

#: The first panels by default (globs; keys no run has are skipped).
DEFAULT_METRICS: tuple[str, ...] = (
    "train/reward_mean",
    "val/accuracy",
    "train/loss",
    "train/*kl*",
    "train/*clip_frac*",
    "train/reward_response_length_mean",
)
#: The objective's own metrics, shown after the defaults: ``train/<namespace>/<name>``.
OBJECTIVE_METRICS = "train/*/*"
#: Namespaced keys that are not the objective's (per reward function means).
NOT_OBJECTIVE = ("train/reward_fn/*",)

Smoother = Callable[[list[float], list[float]], list[float]]


class PlotError(ValueError):
    """Plot arguments that do not fit the runs (a --metrics glob that matches nothing, ...);
    ``choices`` ends the message with what there is instead, kept whole in the one-line report."""

    def __init__(self, message: str, choices: Iterable[str] | None = None, label: str = "") -> None:
        self.choices = ""
        if choices is not None:
            message, self.choices = listing(message, label, choices)
        super().__init__(message)


@dataclass(frozen=True)
class Run:
    """One run's records and the label it has in the legend."""

    label: str
    rows: list[dict[str, Any]]

    def keys(self) -> set[str]:
        return {k for row in self.rows for k in row if k != "step"}

    def series(self, key: str) -> tuple[list[float], list[float]]:
        """(steps, values) of ``key``; a step written twice keeps its last value."""
        points = {row["step"]: row[key] for row in self.rows if row.get(key) is not None}
        steps = sorted(points)
        return steps, [float(points[s]) for s in steps]


def metrics_file(path: str | Path) -> Path:
    """``path`` itself when it is a file, else ``path/metrics.jsonl``."""
    return Path(path) if Path(path).is_file() else Path(path) / "metrics.jsonl"


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Each path is a run directory (holding ``metrics.jsonl``) or a ``metrics.jsonl`` itself.
    Legend labels are the directory names, with as many parent folders as tell them apart."""
    files = [metrics_file(p) for p in paths]
    for given, f in zip(paths, files, strict=True):
        if not f.is_file():
            raise FileNotFoundError(f"{given}: no metrics.jsonl there; is this a run directory?")
    labels = short_labels([f.parent.resolve() for f in files])
    return [Run(label, read_metrics(f)) for label, f in zip(labels, files, strict=True)]


def short_labels(dirs: Sequence[Path]) -> list[str]:
    """The shortest path tails (``name``, ``parent/name``, ...) that are all different."""
    for depth in range(1, max(len(d.parts) for d in dirs) + 1):
        labels = ["/".join(d.parts[-depth:]) for d in dirs]
        if len(set(labels)) == len(labels):
            return labels
    return [str(d) for d in dirs]  # the same directory given twice


def select_metrics(runs: Sequence[Run], patterns: Sequence[str] = ()) -> list[str]:
    """The keys to plot, in pattern order. Explicit ``patterns`` must each match a key of some
    run; the defaults skip what no run has and end with the objective's own metrics."""
    available = sorted(set().union(*(r.keys() for r in runs)))
    chosen: list[str] = []
    for pattern in patterns or DEFAULT_METRICS:
        found = fnmatch.filter(available, pattern)
        if patterns and not found:
            raise PlotError(
                f"--metrics {pattern!r} matches no key of metrics.jsonl", available, "keys"
            )
        chosen += [k for k in found if k not in chosen]
    if not patterns:
        own = fnmatch.filter(available, OBJECTIVE_METRICS)
        chosen += [
            k
            for k in own
            if k not in chosen and not any(fnmatch.fnmatch(k, p) for p in NOT_OBJECTIVE)
        ]
    if not chosen:
        raise PlotError("the runs' metrics.jsonl hold no metrics to plot yet")
    return chosen


def parse_smoothing(spec: str) -> Smoother:
    """``ema:A`` (exponential moving average, weight A per step on the past, 0 <= A < 1) or
    ``window:N`` (mean over the last N steps). Both count steps, not points, so a metric logged
    every step and one logged every 250 (held-out accuracy) are smoothed over the same span."""
    kind, _, raw = spec.partition(":")
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if kind == "ema" and 0 <= value < 1:
        return lambda xs, ys: ema(xs, ys, value)
    if kind == "window" and value.is_integer() and value >= 1:
        return lambda xs, ys: trailing_mean(xs, ys, int(value))
    raise PlotError(f"--smooth {spec!r}: expected ema:A with 0 <= A < 1, or window:N with N >= 1")


def ema(xs: Sequence[float], ys: Sequence[float], alpha: float) -> list[float]:
    """s_0 = y_0, s_i = w * s_{i-1} + (1 - w) * y_i with w = alpha ** (x_i - x_{i-1})."""
    out: list[float] = []
    for i, y in enumerate(ys):
        w = alpha ** (xs[i] - xs[i - 1]) if out else 0.0
        out.append(w * out[-1] + (1 - w) * y if out else y)
    return out


def trailing_mean(xs: Sequence[float], ys: Sequence[float], window: int) -> list[float]:
    """At each point, the mean of the values at steps in (x_i - window, x_i]."""
    out: list[float] = []
    for x in xs:
        recent = [y for xj, y in zip(xs, ys, strict=True) if x - window < xj <= x]
        out.append(sum(recent) / len(recent))
    return out


def build_figure(runs: Sequence[Run], keys: Sequence[str], smoother: Smoother | None = None):
    """A matplotlib figure: one panel per key, one colour per run, one legend for the runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows + 0.5), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    handles: dict[str, Any] = {}
    for ax, key in zip(axes.flat, keys, strict=False):
        for i, run in enumerate(runs):
            xs, ys = run.series(key)
            if not xs:
                continue
            style = {"color": colours[i % len(colours)], "marker": "o" if len(xs) < 30 else None}
            if smoother is not None:
                ax.plot(xs, ys, alpha=0.25, linewidth=1, color=style["color"])
                ys = smoother(xs, ys)
            (line,) = ax.plot(xs, ys, label=run.label, markersize=3, **style)
            handles.setdefault(run.label, line)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=min(len(handles), 4))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / (3.0 * rows + 0.5)))
    return fig


def plot_runs(
    paths: Sequence[str | Path],
    out: str | Path | None = None,
    metrics: Sequence[str] = (),
    smooth: str | None = None,
) -> Path:
    """Render the runs at ``paths`` to a PNG and return its path: ``out``, else
    ``RUN/curves.png`` for one run and ``./curves.png`` for several."""
    smoother = parse_smoothing(smooth) if smooth else None
    runs = load_runs(paths)
    keys = select_metrics(runs, metrics)
    if out is None:
        out = (metrics_file(paths[0]).parent if len(paths) == 1 else Path(".")) / "curves.png"
    dest = Path(out)
    fig = build_figure(runs, keys, smoother)
    import matplotlib.pyplot as plt

    dest.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return dest
