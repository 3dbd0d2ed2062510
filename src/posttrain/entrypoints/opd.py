"""The OPD entry: the shared online loop with a teacher phase and an on-policy distillation
objective.

    posttrain opd --config RECIPE [--objective module:function] -- section.key=value ...
    python -m posttrain.entrypoints.opd --config RECIPE -- ...

One step: rollout -> teacher scoring (``placement/teacher.py``) -> reward stage (metrics, held-out
evaluation, optional shared-prefix masking) -> policy update with the OPD objective
(``algorithm/opd.py``, or the builder ``--objective`` names) -> weight sync. This file holds no
loss math and no loop (``run/online.py``); it pins ``job.algorithm=opd`` and declares the teacher.
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

#: The entry as the run session sees it: it only ever trains OPD (``job.algorithm=opd`` is
#: appended after the user's overrides) and refuses a GRPO-family config.
SPEC = entry_spec("opd")


def run(
    config: PosttrainConfig | None,
    config_path: str,
    opts: Sequence[str],
    out_dir: str | Path | None,
    build_objective_fn=None,
) -> dict[str, Any]:
    """Distil ``teacher.name_or_path`` into the policy with ``build_objective_fn(rl, context)``
    (None: the builder the config names, ``config.build.objective_builder``).

    Refuses a non-OPD ``job.algorithm`` before anything touches the run directory, and a teacher
    whose tokenizer is not the student's before any model loads.
    """
    session = RunSession(SPEC, config_path, opts, config)
    # The loop, the teacher's role and torch after the session: a config error is one line in
    # well under a second.
    from posttrain.placement.teacher import TEACHER, check_teacher_tokenizer
    from posttrain.run import online

    builder = build_objective_fn or objective_builder(session.config)
    return online.run(
        session, out_dir or session.default_out_dir(), builder,
        role_specs=(TEACHER,),  # applied to each rollout before the reward stage
        prepare=check_teacher_tokenizer,
    )  # fmt: skip


def train_from_cli(config_path: str, opts: Sequence[str], objective: str | None = None) -> int:
    """``posttrain opd``: resolve, distil, print where the run went and held-out accuracy."""
    quiet_libraries()
    opts = [*opts, f"rl.objective_builder={objective}"] if objective else list(opts)
    summary = run(None, config_path, opts, None)  # the builder the config names
    from posttrain.run.online import report

    report(summary)
    return 0


if __name__ == "__main__":
    from posttrain.entrypoints.cli import main

    raise SystemExit(main(["opd", *sys.argv[1:]]))
