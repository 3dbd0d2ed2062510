"""The named choices of the loss primitives, torch-free so the config schema can use the very
same Literals (one definition each) without importing torch."""

from __future__ import annotations

import typing
from typing import Literal

LossType = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-fixed"
]
LOSS_TYPES: tuple[str, ...] = typing.get_args(LossType)
#: Reductions that sum a response's tokens, so a response weighs in proportion to its length.
LENGTH_WEIGHTED_LOSS_TYPES = ("seq-mean-token-sum", "seq-mean-token-sum-fixed")

#: Schulman's per-token KL estimators (see ``divergence.kl_penalty``).
KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = typing.get_args(KLEstimator)

#: Advantage estimators of the reward stage (see ``annotators.advantage``).
AdvantageEstimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]
ESTIMATORS: tuple[str, ...] = typing.get_args(AdvantageEstimator)
#: The std an advantage is divided by.
RewardScaling = Literal["group", "batch", "none"]
SCALINGS: tuple[str, ...] = typing.get_args(RewardScaling)
#: Divergences between student and teacher next-token distributions (``divergence.topk_divergence``).
DivergenceKind = Literal["reverse_kl", "forward_kl", "jsd"]
DIVERGENCES: tuple[str, ...] = typing.get_args(DivergenceKind)
