"""The Diffusion-DPO entry: a pairs manifest -> the policy role -> the offline loop.

    posttrain dpo --config RECIPE -- section.key=value ...

DPO is offline: no rollout, no reward stage. Each step draws ``dpo.pairs_per_step`` pairs in a
seeded order (a pure function of job.seed and the step, so resume needs no data cursor), gives
every pair a fresh noise seed, and takes one optimizer step with the objective that
:func:`build_trainer` assembles: Diffusion-DPO against a frozen copy of the starting model, or
the plain denoising loss on the chosen images (``dpo.loss=sft_chosen``). Every
``rl.eval_every`` steps it samples fresh images from fixed seeds and reports the preference
scorer's mean and the fraction of valid shapes, with a PNG grid per evaluation.
"""

from __future__ import annotations

import copy
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from posttrain.algorithm.dpo import (
    DiffusionReferenceScorer,
    make_denoising_objective,
    make_dpo_objective,
)
from posttrain.config import PosttrainConfig
from posttrain.control.entries import refuse_unread_overrides
from posttrain.data import shapes
from posttrain.data.images import PairBatch, step_seeds
from posttrain.data.order import step_indices
from posttrain.data.pairs import load_pairs, write_grid
from posttrain.model.diffusion import alphas_cumprod, unet_config
from posttrain.run.records import default_out_dir
from posttrain.run.session import RunSession, entry_spec, report_lines
from posttrain.trainer import Trainer
from posttrain.trainer.errors import ResumeError

__all__ = ["SPEC", "build_trainer", "default_out_dir", "run", "step_pairs", "train_from_cli"]

log = logging.getLogger("posttrain")

#: Starting-noise seeds of evaluation sample i are EVAL_SEED + i in every run, so base, DPO and
#: the fine-tune-on-winners baseline are compared on the same noise.
EVAL_SEED = 10_000_000


def build_trainer(
    config: PosttrainConfig, unet: nn.Module, scheduler: Any, device: str | None = None
) -> Trainer:
    """DPO's assembly boundary: config -> objective (and its frozen reference) -> trainer.

    The reference is a deep copy of the starting model, handed to the trainer as an auxiliary
    model (the trainer places and freezes it); the objective reads it only through the
    ``DiffusionReferenceScorer`` its loss closes over.
    """
    alphas = alphas_cumprod(scheduler)
    auxiliary: tuple[nn.Module, ...] = ()
    if config.dpo.loss == "dpo":
        reference = copy.deepcopy(unet)
        objective = make_dpo_objective(
            DiffusionReferenceScorer(reference, alphas, config.dpo.min_timestep),
            beta=config.dpo.beta,
            alphas_cumprod=alphas,
        )
        auxiliary = (reference,)
    else:
        objective = make_denoising_objective(alphas_cumprod=alphas)
    rl = config.rl
    return Trainer(
        unet, objective, lr=rl.lr, micro_batch_size=rl.micro_batch_size,
        optimizer=rl.optimizer, weight_decay=rl.weight_decay,
        betas=(rl.adam_beta1, rl.adam_beta2), grad_clip=rl.grad_clip,
        lr_schedule=rl.lr_schedule, warmup_steps=rl.warmup_steps, total_steps=rl.max_steps,
        precision=config.model.dtype, max_consecutive_nonfinite=rl.max_consecutive_nonfinite,
        auxiliary_models=auxiliary, device=device,
    )  # fmt: skip


def step_pairs(pairs: PairBatch, seed: int, step: int, per_step: int) -> PairBatch:
    """The pairs of ``step`` (1-based): consecutive slots of per-epoch seeded permutations
    (``data/order.py``), each with a fresh noise seed."""
    rows = step_indices(len(pairs), seed, step, per_step)
    return pairs[rows].with_seeds(step_seeds(seed, step, per_step))


#: The entry as the run session sees it.
SPEC = entry_spec("dpo")
#: Progress shows these metrics (label -> metric) besides the step time.
SHOWN = {"loss": "train/loss", "scorer": "val/scorer_mean", "valid": "val/validity"}


def run(
    config: PosttrainConfig | None,
    config_path: str,
    opts: Sequence[str],
    out_dir: str | Path | None = None,
    build_trainer_fn=build_trainer,
) -> dict[str, Any]:
    """Train on ``dpo.pairs_path``; returns a summary with the first and last evaluation.
    ``config`` is the caller's resolved copy (checked against ``config_path`` + ``opts``) or
    None; ``out_dir`` None is the config's own run directory."""
    from posttrain.placement.diffusion import place_diffusion

    session = RunSession(SPEC, config_path, opts, config)
    resolved = session.config
    refuse_unread_overrides(opts, resolved)  # what preflight cannot see (default values)
    unet_cfg = unet_config(resolved.model.name_or_path)
    pairs = load_pairs(  # data errors surface before any model loads
        resolved.dpo.pairs_path, unet_cfg["sample_size"], unet_cfg["num_class_embeds"]
    )

    def place(run_dir: Path):
        return place_diffusion(resolved, config_path, session.opts, build_trainer_fn, str(run_dir))

    def body(placed, state, run_dir: Path):
        return DPOBody(resolved, placed.policy, pairs, unet_cfg["num_class_embeds"], run_dir, state)

    summary = session.run(out_dir or session.default_out_dir(), place, body)
    summary["pairs"] = len(pairs)
    return summary


def evaluate(config: PosttrainConfig, policy, classes: int, run_dir: Path, step: int) -> dict:
    """Fresh samples from fixed seeds: scorer mean and validity; writes the step's PNG grid."""
    d = config.dpo
    n = d.eval_samples_per_class
    labels = torch.arange(classes).repeat_interleave(n)
    images = shapes.from_tensor(
        policy.sample(
            labels, [EVAL_SEED + i for i in range(len(labels))], d.sample_steps, d.sample_eta
        )
    )
    write_grid(run_dir / "samples" / f"step_{step:06d}.png", images, columns=n)
    metrics = shapes.evaluate_images(images, labels.numpy(), d.target_color)
    return {f"val/{k}": v for k, v in metrics.items()}


class DPOBody:
    """One DPO step (the step's pairs -> one optimizer step) and the sampled evaluation."""

    shown = SHOWN

    def __init__(self, config, policy, pairs: PairBatch, classes: int, run_dir: Path, state):
        if state is not None and state.data_state.get("pairs") != len(pairs):
            raise ResumeError(
                f"{state.path} was trained on {state.data_state.get('pairs')} pairs, "
                f"{config.dpo.pairs_path} has {len(pairs)}; resume with the same manifest"
            )
        self.config, self.policy, self.pairs = config, policy, pairs
        self.classes, self.run_dir = classes, run_dir
        self.evaluates = True
        n = config.dpo.eval_samples_per_class
        self.evaluation = f"{n * classes} samples ({n} per class, fixed seeds)"

    def data_state(self) -> dict[str, Any]:
        return {"pairs": len(self.pairs)}

    def evaluate(self, step: int) -> dict[str, float]:
        return evaluate(self.config, self.policy, self.classes, self.run_dir, step)

    def step(self, step: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        batch = step_pairs(self.pairs, self.config.job.seed, step, self.config.dpo.pairs_per_step)
        record = dict(self.policy.train(batch))
        record["time/step_s"] = time.perf_counter() - t0
        return record


def train_from_cli(config_path: str, opts: Sequence[str]) -> int:
    """``posttrain dpo``: resolve, train, print where the run went and both evaluations."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    summary = run(None, config_path, opts)
    print("\n".join(report_lines(summary)))
    for key in ("initial", "final"):
        if key in summary:
            print(f"{key}: {json.dumps({k[4:]: round(v, 4) for k, v in summary[key].items()})}")
    return 0


if __name__ == "__main__":
    from posttrain.entrypoints.cli import main

    raise SystemExit(main(["dpo", *sys.argv[1:]]))
