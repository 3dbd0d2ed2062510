"""The named choices of the loss primitives, torch-free so the config schema can use the very
same Literals (one definition each) without importing torch."""

from __future__ import annotations

import typing
from typing import Literal

LossType = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-fixed"
]
LOSS_TYPES: tuple[str, ...] = typing.get_args(LossType)

#: Schulman's per-token KL estimators (see ``divergence.kl_penalty``).
KLEstimator = Literal["k1", "k2", "k3"]
KL_ESTIMATORS: tuple[str, ...] = typing.get_args(KLEstimator)

#: Divergences between student and teacher next-token distributions (``divergence.topk_divergence``).
DivergenceKind = Literal["reverse_kl", "forward_kl", "jsd"]
DIVERGENCES: tuple[str, ...] = typing.get_args(DivergenceKind)
