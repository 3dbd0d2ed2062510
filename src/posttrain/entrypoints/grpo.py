"""The GRPO entry: the shared online loop with a GRPO-family objective.

    posttrain grpo --config RECIPE [--objective module:function] -- section.key=value ...
    python -m posttrain.entrypoints.grpo --config RECIPE -- ...

The objective is whatever the builder returns: the built-in (the surrogate ``rl.grpo_surrogate``
selects) unless ``rl.objective_builder`` (``--objective``) names another one
(``config.build.objective_builder``). This file holds no loss math and no loop (``online.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.config import PosttrainConfig, load_config
from posttrain.config.build import objective_builder
from posttrain.control.opd import check_entry
from posttrain.entrypoints import online
from posttrain.run.records import default_out_dir, quiet_libraries


def run(
    config: PosttrainConfig,
    config_path: str,
    opts: Sequence[str],
    out_dir: str | Path,
    build_objective_fn,
) -> dict[str, Any]:
    """Train ``config`` with the objective ``build_objective_fn(rl, context)`` returns."""
    check_entry(config, "grpo")  # job.algorithm=opd belongs to `posttrain opd`
    return online.run(config, config_path, opts, out_dir, build_objective_fn)


def train_from_cli(config_path: str, opts: Sequence[str], objective: str | None = None) -> int:
    """``posttrain grpo``: resolve, train, print where the run went and held-out accuracy."""
    quiet_libraries()
    opts = [*opts, f"rl.objective_builder={objective}"] if objective else list(opts)
    config = load_config(config_path, ["--", *opts])
    builder = objective_builder(config)  # the recipe's or --objective's, else the built-in
    online.report(run(config, config_path, opts, default_out_dir(config), builder))
    return 0


if __name__ == "__main__":
    from posttrain.entrypoints.cli import main

    raise SystemExit(main(["grpo", *sys.argv[1:]]))
