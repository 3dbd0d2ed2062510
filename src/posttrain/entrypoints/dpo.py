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
from posttrain.config import ConfigError, PosttrainConfig, load_config, to_dict
from posttrain.control import objective_family, run_preflight
from posttrain.data import shapes
from posttrain.data.images import PairBatch, step_seeds
from posttrain.data.pairs import load_pairs, write_grid
from posttrain.metrics import open_sinks
from posttrain.model.diffusion import alphas_cumprod, unet_config
from posttrain.run.lock import RunLock, prepare_run_dir
from posttrain.run.records import default_out_dir, refuse_driver_edits, write_resolved_config
from posttrain.trainer import Trainer
from posttrain.trainer.errors import ResumeError

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
    """The pairs of ``step`` (1-based): consecutive slots of per-epoch seeded permutations."""
    n = len(pairs)
    slots = torch.arange((step - 1) * per_step, step * per_step)
    rows = []
    for epoch in torch.unique(slots // n).tolist():
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
        rows.append(perm[slots[slots // n == epoch] % n])
    return pairs[torch.cat(rows)].with_seeds(step_seeds(seed, step, per_step))


def run(
    config: PosttrainConfig,
    config_path: str,
    opts: Sequence[str],
    out_dir: str | Path,
    build_trainer_fn=build_trainer,
) -> dict[str, Any]:
    """Train on ``dpo.pairs_path``; returns a summary with the first and last evaluation."""
    from posttrain.placement.diffusion import place_diffusion

    resolved = load_config(config_path, ["--", *opts])
    refuse_driver_edits(config, resolved)
    if objective_family(resolved) != "dpo":
        raise ConfigError(
            f"posttrain dpo needs job.algorithm to start with 'dpo', got "
            f"{resolved.job.algorithm!r}; set job.algorithm=dpo"
        )
    for message in run_preflight(resolved):
        log.warning("preflight: %s", message)
    unet_cfg = unet_config(resolved.model.name_or_path)
    pairs = load_pairs(  # data errors surface before any model loads
        resolved.dpo.pairs_path, unet_cfg["sample_size"], unet_cfg["num_class_embeds"]
    )
    run_dir = prepare_run_dir(out_dir)
    with RunLock(run_dir):  # one writer per run directory
        placed = place_diffusion(resolved, config_path, opts, build_trainer_fn, str(run_dir))
        try:
            return _loop(resolved, placed.policy, pairs, unet_cfg["num_class_embeds"], run_dir)
        finally:
            placed.close()


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


def _loop(config, policy, pairs: PairBatch, classes: int, run_dir: Path) -> dict[str, Any]:
    job, rl = config.job, config.rl
    state = policy.resume()
    if state is not None and state.data_state.get("pairs") != len(pairs):
        raise ResumeError(
            f"{state.path} was trained on {state.data_state.get('pairs')} pairs, "
            f"{config.dpo.pairs_path} has {len(pairs)}; resume with the same manifest"
        )
    write_resolved_config(config, run_dir)
    start = state.step if state else 0
    sink = open_sinks(
        run_dir, resume_step=start if state else None, tensorboard=config.logging.tensorboard,
        wandb=config.logging.wandb, wandb_project=config.logging.wandb_project,
        wandb_mode=config.logging.wandb_mode, run_name=job.name, config=to_dict(config),
    )  # fmt: skip
    summary: dict[str, Any] = {"run_dir": str(run_dir), "start_step": start, "pairs": len(pairs)}
    if rl.eval_every and start == 0:
        first = evaluate(config, policy, classes, run_dir, 0)
        sink.write(0, first)
        summary["initial"] = first
    began = time.perf_counter()
    try:
        for step in range(start + 1, rl.max_steps + 1):
            t0 = time.perf_counter()
            record = dict(
                policy.train(step_pairs(pairs, job.seed, step, config.dpo.pairs_per_step))
            )
            record["time/step_s"] = time.perf_counter() - t0
            if rl.eval_every and (step % rl.eval_every == 0 or step == rl.max_steps):
                record.update(evaluate(config, policy, classes, run_dir, step))
                summary["final"] = {k: record[k] for k in ("val/scorer_mean", "val/validity")}
            sink.write(step, record)
            if (rl.save_every and step % rl.save_every == 0) or step == rl.max_steps:
                policy.save(step, {"pairs": len(pairs)})
            if config.logging.progress and (step % 25 == 0 or step == rl.max_steps):
                log.info("step %d/%d loss %.4f", step, rl.max_steps, record["train/loss"])
    finally:
        sink.close()
    summary["steps"] = rl.max_steps
    summary["wall_s"] = time.perf_counter() - began
    return summary


def train_from_cli(config_path: str, opts: Sequence[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = load_config(config_path, ["--", *opts])
    summary = run(config, config_path, opts, default_out_dir(config))
    print(f"run directory: {summary['run_dir']}")
    for key in ("initial", "final"):
        if key in summary:
            print(f"{key}: {json.dumps({k[4:]: round(v, 4) for k, v in summary[key].items()})}")
    return 0


if __name__ == "__main__":
    from posttrain.entrypoints.cli import main

    raise SystemExit(main(["dpo", *sys.argv[1:]]))
