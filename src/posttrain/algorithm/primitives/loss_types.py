"""The loss reductions of the policy-gradient surrogates, by name (torch-free, so the config
schema can use the same Literal without importing torch)."""

from __future__ import annotations

import typing
from typing import Literal

LossType = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-fixed"
]
LOSS_TYPES: tuple[str, ...] = typing.get_args(LossType)
