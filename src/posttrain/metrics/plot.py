"""``posttrain plot RUN [RUN ...]``: curves from ``metrics.jsonl``, one panel per metric, the runs
overlaid with a legend.

Without ``--metrics`` the panels are what a researcher looks at first -- reward, held-out
accuracy and the entry's other validation metrics (every ``val/*`` key: DPO's
``val/scorer_mean`` and ``val/validity``), loss, KL, clip fractions, response length --
followed by the objective's own metrics (every ``train/<namespace>/<name>`` key, e.g. GRPO's
``train/pg/*``), so a new objective's statistics appear without editing this file. A default
series that is constant over the run (ratios at 1 and clip fractions at 0 with one update per
batch) is left out and named in a note, except the reward and the headline validation metrics.
``--metrics`` takes names or shell-style globs over the keys of ``metrics.jsonl`` and draws
whatever it names. ``--smooth ema:0.9`` or ``--smooth window:10`` draws a smoothed
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
    "val/*",
    "train/loss",
    "train/*kl*",
    "train/*clip_frac*",
    "train/reward_response_length_mean",
)
#: Default panels drawn even when flat, the numbers each entry is judged by (held-out accuracy
#: online; DPO's scorer mean and validity): one stuck at 0 is a result, while a ratio at 1 with
#: one update per batch is a property of the setup.
KEEP_FLAT: tuple[str, ...] = (
    "train/reward_mean",
    "val/accuracy",
    "val/scorer_mean",
    "val/validity",
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
    """The keys to plot, in pattern order (:func:`choose_panels` without the left-out keys)."""
    return choose_panels(runs, patterns)[0]


def constant_value(runs: Sequence[Run], key: str) -> float | None:
    """The one value ``key`` takes at every point of every run, when it has at least two points
    and never changes; else None."""
    values = [v for run in runs for v in run.series(key)[1]]
    return values[0] if len(values) >= 2 and len(set(values)) == 1 else None


def choose_panels(
    runs: Sequence[Run], patterns: Sequence[str] = ()
) -> tuple[list[str], dict[str, float]]:
    """``(keys to plot, left-out key -> its constant value)``. Explicit ``patterns`` must each
    match a key of some run and are all drawn. The defaults skip what no run has, end with the
    objective's own metrics, and leave out what is constant over the runs -- except
    :data:`KEEP_FLAT`, and unless nothing else would be left."""
    chosen = _matching(runs, patterns)
    if patterns:
        return chosen, {}
    constant = {
        k: v
        for k in chosen
        if not any(fnmatch.fnmatch(k, p) for p in KEEP_FLAT)
        and (v := constant_value(runs, k)) is not None
    }
    varying = [k for k in chosen if k not in constant]
    return (varying, constant) if varying else (chosen, {})


def _matching(runs: Sequence[Run], patterns: Sequence[str]) -> list[str]:
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
    note: Callable[[str], None] | None = None,
) -> Path:
    """Render the runs at ``paths`` to a PNG and return its path: ``out``, else
    ``RUN/curves.png`` for one run and ``./curves.png`` for several. ``note`` receives one line
    naming the constant series the default panels left out."""
    smoother = parse_smoothing(smooth) if smooth else None
    runs = load_runs(paths)
    keys, constant = choose_panels(runs, metrics)
    if constant and note is not None:
        flat = ", ".join(f"{k}={v:g}" for k, v in constant.items())
        note(f"left out {len(constant)} series constant over the run ({flat}); name them with "
             "--metrics to draw them")  # fmt: skip
    if out is None:
        out = (metrics_file(paths[0]).parent if len(paths) == 1 else Path(".")) / "curves.png"
    dest = Path(out)
    fig = build_figure(runs, keys, smoother)
    import matplotlib.pyplot as plt

    dest.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return dest
