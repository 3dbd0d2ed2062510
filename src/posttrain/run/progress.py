"""How a run shows its progress, for every entry: a tqdm bar on a terminal, plain lines elsewhere.

A bar redraws itself with ``\\r`` frames: fine on a terminal, hundreds of kilobytes of noise in a
log file or a scheduler's captured stderr. So the bar is drawn only when ``logging.progress`` is
on *and* stderr is a terminal; otherwise one plain log line goes out every ``logging.log_every``
steps, at the first step this process runs (a slow step would otherwise leave minutes without a
word) and at the last step, which reads the same in a file as on a screen.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

from posttrain.config import PosttrainConfig

log = logging.getLogger("posttrain")


class Progress:
    """``advance(step, record)`` after each step; ``close()`` at the end. ``shown`` maps a label
    to the metric it shows (``{"reward": "train/reward_mean"}``); absent metrics are left out."""

    def __init__(
        self, config: PosttrainConfig, start: int, shown: Mapping[str, str], stream=None
    ) -> None:
        self.total, self.every = config.rl.max_steps, config.logging.log_every
        self.name, self.shown, self.first = config.job.name, dict(shown), start + 1
        stream = sys.stderr if stream is None else stream
        self.bar = None
        if config.logging.progress and _is_terminal(stream):
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, initial=start, desc=self.name, unit="step",
                            dynamic_ncols=True, file=stream)  # fmt: skip

    def values(self, record: Mapping[str, Any]) -> dict[str, str]:
        out = {label: _fmt(record[key]) for label, key in self.shown.items() if key in record}
        if "time/step_s" in record:
            out["step_s"] = f"{record['time/step_s']:.2f}"
        return out

    def advance(self, step: int, record: Mapping[str, Any]) -> None:
        if self.bar is not None:
            self.bar.set_postfix(self.values(record), refresh=False)
            self.bar.update(1)
        elif self.every and (step % self.every == 0 or step in (self.first, self.total)):
            parts = " ".join(f"{k} {v}" for k, v in self.values(record).items())
            log.info("%s step %d/%d %s", self.name, step, self.total, parts)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _fmt(value: Any) -> str:
    return "nan" if value is None else f"{float(value):.4g}"
