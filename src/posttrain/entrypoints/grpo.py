"""The GRPO entry: the shared online loop with a GRPO-family objective.

    posttrain grpo --config RECIPE [--objective module:function] -- section.key=value ...
    python -m posttrain.entrypoints.grpo --config RECIPE -- ...

The objective is whatever the builder returns: the built-in (the surrogate ``rl.grpo_surrogate``
selects) unless ``rl.objective_builder`` (``--objective``) names another one
(``config.build.objective_builder``). This file holds no loss math and no loop (``run/online.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.config import PosttrainConfig
from posttrain.config.build import objective_builder
from posttrain.run.records import default_out_dir, quiet_libraries
from posttrain.run.session import RunSession, entry_spec

__all__ = ["SPEC", "default_out_dir", "run", "train_from_cli"]

#: The entry as the run session sees it (its registry row): GRPO pins nothing (it is the default
#: algorithm) and refuses another entry's config.
SPEC = entry_spec("grpo")


def run(
    config: PosttrainConfig | None,
    config_path: str,
    opts: Sequence[str],
    out_dir: str | Path | None,
    build_objective_fn=None,
) -> dict[str, Any]:
    """Train with the objective ``build_objective_fn(rl, context)`` returns (None: the one the
    config names, ``config.build.objective_builder``). ``config`` is the caller's resolved copy
    (checked against ``config_path`` + ``opts``), or None; ``out_dir`` None is the config's own
    run directory."""
    session = RunSession(SPEC, config_path, opts, config)
    # The loop (and torch) after the session: a config error is one line in well under a second.
    from posttrain.run import online

    builder = build_objective_fn or objective_builder(session.config)
    return online.run(session, out_dir or session.default_out_dir(), builder)


def train_from_cli(config_path: str, opts: Sequence[str], objective: str | None = None) -> int:
    """``posttrain grpo``: resolve, train, print where the run went and held-out accuracy."""
    quiet_libraries()
    opts = [*opts, f"rl.objective_builder={objective}"] if objective else list(opts)
    summary = run(None, config_path, opts, None)  # the builder the config names
    from posttrain.run.online import report

    report(summary)
    return 0


if __name__ == "__main__":
    from posttrain.entrypoints.cli import main

    raise SystemExit(main(["grpo", *sys.argv[1:]]))
