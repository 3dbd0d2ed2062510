"""``posttrain dpo pretrain`` and ``posttrain dpo make-pairs``: the base model and the pairs.

pretrain: a tiny class-conditional UNet trained with the plain denoising loss, through the same
trainer, on fresh images of the built-in shapes domain at every step; the exponential moving
average of its weights is saved as a diffusers DDPMPipeline folder.

make-pairs: sample groups of ``--candidates`` images per class from a model folder (seeded),
score each with the built-in preference scorer (target colour, centring), and keep the best and
the worst of each group as (chosen, rejected); writes PNGs and a pairs manifest.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import time
from pathlib import Path

import torch

from posttrain.algorithm.dpo import make_denoising_objective
from posttrain.config import ConfigError
from posttrain.data import shapes
from posttrain.data.images import ImageBatch, step_seeds
from posttrain.data.pairs import PairDataError, write_grid, write_pairs
from posttrain.model.diffusion import (
    alphas_cumprod,
    build_tiny_unet,
    load_pipeline,
    new_scheduler,
    sample,
    save_pipeline,
)
from posttrain.trainer import Trainer

log = logging.getLogger("posttrain")


def pretrain(args: argparse.Namespace) -> int:
    """Train a base model from random weights on the shapes domain; save it to ``--out``."""
    if not 0 <= args.ema_decay < 1:
        raise ConfigError(f"pretrain: --ema-decay must be in [0, 1), got {args.ema_decay}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    classes = len(shapes.CLASSES)
    unet = build_tiny_unet(args.image_size, classes, args.seed)
    scheduler = new_scheduler()
    ema = copy.deepcopy(unet).requires_grad_(False)
    trainer = Trainer(
        unet, make_denoising_objective(alphas_cumprod=alphas_cumprod(scheduler)), lr=args.lr,
        micro_batch_size=args.batch_size, grad_clip=1.0, lr_schedule="cosine",
        warmup_steps=min(50, args.steps // 10), total_steps=args.steps,
    )  # fmt: skip
    began = time.perf_counter()
    for step in range(1, args.steps + 1):
        images, labels = shapes.random_images(
            args.batch_size, args.image_size, seed=args.seed * 1_000_003 + step
        )
        batch = ImageBatch(
            shapes.to_tensor(images),
            torch.from_numpy(labels),
            step_seeds(args.seed, step, args.batch_size),
        )
        metrics = trainer.step(batch)
        update_ema(ema, trainer.model, min(args.ema_decay, (1 + step) / (10 + step)))
        if step % 100 == 0 or step == args.steps:
            log.info("pretrain step %d/%d loss %.4f (%.0f s)", step, args.steps,
                     metrics["train/loss"], time.perf_counter() - began)  # fmt: skip
    out = Path(args.out)
    save_pipeline(out, ema, scheduler)
    print(f"base model: {out} ({args.steps} steps in {time.perf_counter() - began:.0f} s)")
    return 0


@torch.no_grad()
def update_ema(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    """ema <- decay·ema + (1 - decay)·model, parameters and buffers alike.

    The average is what gets saved: the last iterates of a short run still carry the noise of
    their own batches, and their samples a faint haze that fine-tuning on them amplifies.
    """
    for e, p in zip(ema.state_dict().values(), model.state_dict().values(), strict=True):
        if e.is_floating_point():
            e.lerp_(p.to(e.device), 1 - decay)
        else:
            e.copy_(p)


def make_pairs(args: argparse.Namespace) -> int:
    """Sample, score, and write best-vs-worst pairs per group; prints the manifest path.

    With ``--valid-only`` only candidates the validity detector accepts enter a pair (a group
    with fewer than two is skipped), so a pair differs in the preference alone: the scorer on its
    own prefers some degraded samples (a centred blob of mixed colours), and pairs that encode
    that teach it.
    """
    unet, scheduler = load_pipeline(args.model)
    classes = unet.config.num_class_embeds
    k, groups = args.candidates, args.pairs_per_class
    labels = torch.arange(classes).repeat_interleave(groups * k)
    seeds = [args.seed * 1_000_003 + i for i in range(len(labels))]
    images = sample(unet, scheduler, labels, seeds, args.sample_steps, args.eta)
    pixels = shapes.from_tensor(images)
    scores = torch.tensor([shapes.preference_score(p, args.target_color) for p in pixels])
    valid = torch.tensor([shapes.is_valid(p, int(c)) for p, c in zip(pixels, labels, strict=True)])
    rows, chosen, rejected = [], [], []
    for g in range(classes * groups):
        idx = torch.arange(g * k, (g + 1) * k)
        if args.valid_only:
            idx = idx[valid[idx]]
        if len(idx) < 2:
            continue
        best, worst = idx[scores[idx].argmax()], idx[scores[idx].argmin()]
        chosen.append(int(best))
        rejected.append(int(worst))
        rows.append((int(labels[best]), images[best], images[worst]))
    if not rows:
        raise PairDataError("make-pairs: no group had two usable candidates; raise --candidates")
    out = Path(args.out)
    manifest = write_pairs(out, rows)
    write_grid(out / "candidates.png", pixels, columns=8 * k)
    stats = {
        "pairs": len(rows),
        "candidate_scorer_mean": float(scores.mean()),
        "candidate_validity": float(valid.float().mean()),
        "chosen_scorer_mean": float(scores[chosen].mean()),
        "rejected_scorer_mean": float(scores[rejected].mean()),
        "chosen_validity": float(valid[chosen].float().mean()),
        "rejected_validity": float(valid[rejected].float().mean()),
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    print(f"pairs: {manifest} {json.dumps({k: round(v, 4) for k, v in stats.items()})}")
    return 0
