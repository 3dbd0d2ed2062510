"""The ``dpo`` section: Diffusion-DPO on preference pairs (read only when job.algorithm is dpo*).

The optimisation schedule (lr, its schedule and warmup, steps, micro-batches, clipping, saving,
evaluation cadence, resume) stays in ``rl``, its single owner; this section holds what only the
diffusion preference run reads.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from posttrain.config.base import Section

TargetColor = Literal["red", "green", "blue", "yellow", "cyan", "magenta"]


class DPOConfig(Section):
    """Diffusion preference optimisation: the loss, the pairs, and how samples are evaluated."""

    section_name = "dpo"

    loss: Literal["dpo", "sft_chosen"] = Field(
        "dpo",
        description="`dpo`: Diffusion-DPO against a frozen copy of the starting model. "
        "`sft_chosen`: the plain denoising loss on the chosen images only (fine-tune on "
        "winners, the baseline that sees the same pairs).",
    )
    beta: float = Field(
        5.0,
        gt=0,
        description="β of Diffusion-DPO; the loss scales the error difference by β·T/2 with T "
        "the model's training timesteps (β·T = 5000 is the paper's Stable Diffusion setting). "
        "Read only for `dpo.loss=dpo`.",
    )
    min_timestep: int = Field(
        0,
        ge=0,
        description="Diffusion-DPO draws its timestep from min_timestep..T-1: the weighting "
        "ω(λ_t) is 1 there and 0 below (0 keeps the paper's ω = 1 for every t). Read only for "
        "`dpo.loss=dpo`.",
    )
    pairs_path: str | None = Field(
        None,
        min_length=1,
        description='Preference pairs: a JSONL manifest of `{"condition": class id, "chosen": '
        'path, "rejected": path}` rows, image paths relative to the manifest (`posttrain dpo '
        "make-pairs` writes one). Required.",
    )
    pairs_per_step: int = Field(
        16,
        ge=1,
        le=4096,
        description="Pairs per optimizer step, drawn in a seeded order over epochs; each pair "
        "gets a fresh timestep and noise at every step.",
    )
    eval_samples_per_class: int = Field(
        16,
        ge=1,
        description="Fresh samples per class at each evaluation, from fixed seeds (the same "
        "starting noise at every evaluation and in every run).",
    )
    sample_steps: int = Field(25, ge=1, description="DDIM steps per evaluation sample.")
    sample_eta: float = Field(
        1.0,
        ge=0,
        le=1,
        description="DDIM eta of evaluation sampling: 0 is deterministic given the starting "
        "noise, 1 adds the DDPM posterior's noise at each step (seeded per sample). A small base "
        "model leaves a faint haze in the background at eta 0 that eta 1 removes.",
    )
    target_color: TargetColor = Field(
        "red",
        description="The preference the built-in scorer measures at evaluation: a shape of "
        "this colour, centred in the image.",
    )

    @field_validator("beta")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be finite")
        return value


def schedule_problem(dpo: DPOConfig, model_dir: str | Path) -> str | None:
    """What in ``dpo`` the model's DDPM schedule cannot honour, or None.

    The schedule's length T (``num_train_timesteps``) belongs to the model, not the config, so
    this reads ``scheduler/scheduler_config.json`` of the pipeline folder (no weights): the
    timestep ``dpo.min_timestep`` must lie in 0..T-1 and DDIM's ``dpo.sample_steps`` in 1..T.
    None too when the folder has no readable schedule (loading the model reports that).
    """
    path = Path(model_dir) / "scheduler" / "scheduler_config.json"
    try:
        steps = json.loads(path.read_text()).get("num_train_timesteps", 1000)
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        return f"{path}: num_train_timesteps is {steps!r}, not a positive int; repair the model"
    problems = []
    if dpo.loss == "dpo" and dpo.min_timestep > steps - 1:
        problems.append(f"dpo.min_timestep={dpo.min_timestep}")
    if dpo.sample_steps > steps:
        problems.append(f"dpo.sample_steps={dpo.sample_steps}")
    if not problems:
        return None
    return (
        f"{' and '.join(problems)} {'exceeds' if len(problems) == 1 else 'exceed'} the model's schedule of {steps} training timesteps "
        f"({path}); use dpo.min_timestep in 0..{steps - 1} and dpo.sample_steps in 1..{steps}"
    )
