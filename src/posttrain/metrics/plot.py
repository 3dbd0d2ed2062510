"""``posttrain plot OUT_DIR``: reward, held-out accuracy and loss curves from metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

PANELS = (
    ("train/reward_mean", "reward (train)"),
    ("val/accuracy", "held-out accuracy"),
    ("train/loss", "loss"),
)


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is this a run directory?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_run(out_dir: str | Path, dest: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    rows = read_metrics(out_dir / "metrics.jsonl")
    dest = Path(dest) if dest else out_dir / "curves.png"
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 3.2))
    for ax, (key, title) in zip(axes, PANELS, strict=True):
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, markersize=3)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(out_dir.name)
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return dest
