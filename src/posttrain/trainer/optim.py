"""Optimizer and learning-rate schedule from plain values.

Weight decay applies to matrices (``ndim >= 2``) only; biases and norm scales are not decayed,
the usual convention for transformers. The schedule is a ``LambdaLR`` over a closure, so its saved
state is only counters and learning rates (loadable with ``weights_only=True``), and a resumed
run may change ``total_steps`` (e.g. a longer ``rl.max_steps``) without it being overwritten.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("constant", "linear", "cosine")


def build_optimizer(
    params: Sequence[nn.Parameter],
    name: str,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
) -> torch.optim.Optimizer:
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a finite number > 0, got {lr}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [
        g
        for g in (
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        )
        if g["params"]
    ]
    if name == "adamw":
        b1, b2 = betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        # One fused kernel per step on CUDA instead of a chain of foreach kernels.
        fused = True if params and all(p.is_cuda for p in params) else None
        return torch.optim.AdamW(groups, lr=lr, betas=(b1, b2), eps=eps, fused=fused)
    return torch.optim.SGD(groups, lr=lr)


def build_scheduler(
    optimizer: torch.optim.Optimizer, schedule: str, warmup_steps: int, total_steps: int | None
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over ``warmup_steps``, then constant, linear or cosine decay to 0."""
    if schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {SCHEDULES}, got {schedule!r}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
    if schedule != "constant" and (total_steps is None or total_steps <= warmup_steps):
        raise ValueError(
            f"lr_schedule={schedule!r} needs total_steps > warmup_steps={warmup_steps}, "
            f"got total_steps={total_steps}"
        )

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
