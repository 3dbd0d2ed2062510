"""Group-relative advantages and shared-prefix masking.

These need every member of a group at once, so they run in the reward stage, before dispatch
splits groups across ranks and micro-batches. Nothing downstream may recompute them from a slice.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

AdvantageEstimator = Literal["grpo", "unbiased"]


def _group_index(group_ids: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """(inverse index into unique groups, member counts); validates complete groups."""
    if group_ids.dim() != 1 or group_ids.dtype != torch.int64:
        raise ValueError("group_ids must be a 1-D int64 tensor")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
        raise ValueError(
            f"group_size must be an int >= 2 (a size-1 group has no baseline), got {group_size!r}"
        )
    uniq, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    bad = counts != group_size
    if bool(bad.any()):
        g = int(uniq[bad][0])
        c = int(counts[bad][0])
        raise ValueError(
            f"group {g} has {c} member(s), expected {group_size}: advantages need complete groups "
            "(compute them in the reward stage, before dispatch)"
        )
    return inverse, counts


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    group_size: int,
    estimator: str = "grpo",
    eps: float = 1e-6,
) -> tuple[Tensor, dict[str, float]]:
    """Per-response advantages relative to the response's group.

    ``grpo``: ``(r - mean) / (std + eps)`` with the Bessel-corrected std; ``unbiased`` (Dr-GRPO):
    ``r - mean``. Returns the advantages and stats (``zero_variance_group_frac``: the share of
    groups whose rewards are all equal, which therefore carry no learning signal).
    """
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards must be [N] matching group_ids {tuple(group_ids.shape)}, got {tuple(rewards.shape)}"
        )
    if not rewards.is_floating_point() or not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be a finite floating tensor")
    if estimator not in ("grpo", "unbiased"):
        raise ValueError(f"estimator must be 'grpo' or 'unbiased', got {estimator!r}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    inverse, counts = _group_index(group_ids, group_size)
    n_groups = counts.numel()
    sums = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, rewards)
    mean = sums / counts.to(rewards.dtype)
    # A group of equal rewards carries no signal: detect it exactly (max == min), since
    # sum/count can differ from the common value by rounding and leave ~1e-11 "advantages".
    hi = torch.full((n_groups,), -torch.inf, dtype=rewards.dtype).scatter_reduce(
        0, inverse, rewards, "amax"
    )
    lo = torch.full((n_groups,), torch.inf, dtype=rewards.dtype).scatter_reduce(
        0, inverse, rewards, "amin"
    )
    constant = hi == lo
    centred = torch.where(constant[inverse], 0.0, rewards - mean[inverse])
    sq = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, centred * centred)
    std = torch.sqrt(sq / (counts - 1).to(rewards.dtype))
    zero_var = constant.to(rewards.dtype).mean().item()
    adv = centred if estimator == "unbiased" else centred / (std[inverse] + eps)
    return adv, {"zero_variance_group_frac": zero_var}


def shared_prefix_mask(response_ids: Tensor, response_mask: Tensor, group_ids: Tensor) -> Tensor:
    """``response_mask`` with each group's longest common response prefix masked out.

    Tokens every member of a group shares at the start carry opposite-sign advantages that cancel
    only in expectation; masking them removes that noise. A group of identical responses is
    masked entirely.
    """
    if response_ids.shape != response_mask.shape or response_ids.dim() != 2:
        raise ValueError("response_ids and response_mask must both be [N, R]")
    if response_mask.dtype != torch.bool:
        raise ValueError("response_mask must be bool")
    if group_ids.shape != (response_ids.shape[0],):
        raise ValueError("group_ids must be [N]")
    out = response_mask.clone()
    r = response_ids.shape[1]
    positions = torch.arange(r)
    for g in torch.unique(group_ids).tolist():
        rows = (group_ids == g).nonzero().squeeze(-1)
        ids, msk = response_ids[rows], response_mask[rows]
        # A position is shared when every member has a loss token there and the same id.
        same = (ids == ids[:1]).all(0) & msk.all(0)
        not_same = (~same).nonzero()
        k = int(not_same[0]) if not_same.numel() else r
        out[rows] &= (positions >= k).unsqueeze(0)
    return out
