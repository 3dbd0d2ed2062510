"""The OPD entry: the shared online loop with a teacher phase and an on-policy distillation
objective.

    posttrain opd --config RECIPE [--objective module:function] -- section.key=value ...
    python -m posttrain.entrypoints.opd --config RECIPE -- ...

One step: rollout -> teacher scoring (``placement/teacher.py``) -> reward stage (metrics, held-out
evaluation, optional shared-prefix masking) -> policy update with the OPD objective
(``algorithm/opd.py``, or the builder ``--objective`` names) -> weight sync. This file holds no
loss math and no loop (``online.py``); it pins ``job.algorithm=opd`` and adds the teacher.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.algorithm.opd import make_objective
from posttrain.config import PosttrainConfig, load_config
from posttrain.config.build import objective_builder
from posttrain.control import run_preflight
from posttrain.control.opd import check_entry
from posttrain.entrypoints import online
from posttrain.placement.teacher import check_teacher_tokenizer
from posttrain.run.records import default_out_dir, quiet_libraries

#: The entry's invariant, appended after the user's overrides: it only ever trains OPD.
PINNED_OPTS: tuple[str, ...] = ("job.algorithm=opd",)


def run(
    config: PosttrainConfig,
    config_path: str,
    opts: Sequence[str],
    out_dir: str | Path,
    build_objective_fn=make_objective,
) -> dict[str, Any]:
    """Distil ``teacher.name_or_path`` into the policy with ``build_objective_fn(rl, context)``.

    Refuses a non-OPD ``job.algorithm`` and a teacher whose tokenizer is not the student's, both
    before any model loads.
    """
    check_entry(config, "opd")
    run_preflight(config)  # its errors first; online.run logs the warnings once
    online.ensure_model(config)
    check_teacher_tokenizer(config)
    return online.run(
        config, config_path, opts, out_dir, build_objective_fn, pinned_opts=PINNED_OPTS,
        teacher=True,
    )  # fmt: skip


def train_from_cli(config_path: str, opts: Sequence[str], objective: str | None = None) -> int:
    """``posttrain opd``: resolve, distil, print where the run went and held-out accuracy."""
    quiet_libraries()
    opts = [*opts, f"rl.objective_builder={objective}"] if objective else list(opts)
    config = load_config(config_path, ["--", *opts])
    builder = objective_builder(config)  # the recipe's or --objective's, else the built-in
    online.report(run(config, config_path, opts, default_out_dir(config), builder))
    return 0


if __name__ == "__main__":
    from posttrain.entrypoints.cli import main

    raise SystemExit(main(["opd", *sys.argv[1:]]))
