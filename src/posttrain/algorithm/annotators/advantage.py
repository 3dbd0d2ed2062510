"""Advantage estimators and shared-prefix masking.

These need every member of a group (and, for batch scaling, the whole batch) at once, so they
run in the reward stage, before dispatch splits groups across ranks and micro-batches. Nothing
downstream may recompute them from a slice.

With ``r_i`` the reward of response ``i``, ``g`` its group of ``n_g`` members (sizes may differ
between groups; each group uses its own ``n_g``) and ``B`` the whole batch::

    grpo          A_i = (r_i - mean_g(r)) / (s + eps)
    dr_grpo       A_i =  r_i - mean_g(r)
    rloo          A_i = (r_i - mean_{g minus i}(r)) / (s + eps) = n_g/(n_g-1) (r_i - mean_g(r)) / (s + eps)
    reinforce_pp  A_i = (r_i - mean_B(r)) / (std_B(r) + eps)

``s`` comes from ``scaling``: ``group`` = std of the group's rewards, ``batch`` = std of all
rewards of the batch, ``none`` = no division (and no ``eps``); every std is Bessel-corrected.
A group whose rewards are all equal gets advantage exactly 0 under the group baselines.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posttrain.algorithm.knobs import FIXED_SCALING
from posttrain.algorithm.knobs import (
    advantage_reads as advantage_reads,  # users' builders name it here
)
from posttrain.algorithm.primitives.choices import ESTIMATORS, SCALINGS


def _group_index(group_ids: Tensor, group_size: int | None) -> tuple[Tensor, Tensor]:
    """(inverse index into unique groups, member counts); checks sizes."""
    if group_ids.dim() != 1 or group_ids.dtype != torch.int64:
        raise ValueError("group_ids must be a 1-D int64 tensor")
    if group_size is not None and (
        isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2
    ):
        raise ValueError(
            f"group_size must be an int >= 2 (a size-1 group has no baseline), got {group_size!r}"
        )
    uniq, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    bad = counts != group_size if group_size is not None else counts < 2
    if bool(bad.any()):
        g, c = int(uniq[bad][0]), int(counts[bad][0])
        want = f"expected {group_size}" if group_size is not None else "a baseline needs >= 2"
        raise ValueError(
            f"group {g} has {c} member(s), {want}: advantages need complete groups "
            "(compute them in the reward stage, before dispatch)"
        )
    return inverse, counts


def _batch_std(rewards: Tensor) -> Tensor:
    if rewards.numel() < 2:
        raise ValueError("batch reward scaling needs at least 2 rewards in the batch")
    return rewards.std(unbiased=True)


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    group_size: int | None,
    estimator: str = "grpo",
    scaling: str = "group",
    eps: float = 1e-6,
) -> tuple[Tensor, dict[str, float]]:
    """Per-response advantages (see the module doc for the formulas).

    ``group_size``: the size every group must have, or None to accept groups of any size >= 2
    (e.g. after filtering). ``scaling`` is ignored by ``dr_grpo`` (none) and ``reinforce_pp``
    (batch). Returns the advantages and stats (``zero_variance_group_frac``: the share of groups
    whose rewards are all equal, which carry no signal under a group baseline).
    """
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards must be [N] matching group_ids {tuple(group_ids.shape)}, got {tuple(rewards.shape)}"
        )
    if not rewards.is_floating_point() or not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must be a finite floating tensor")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    scaling = FIXED_SCALING.get(estimator, scaling)
    inverse, counts = _group_index(group_ids, group_size)
    n_groups = counts.numel()
    n = counts.to(rewards.dtype)
    mean = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, rewards) / n
    # A group of equal rewards carries no signal: detect it exactly (max == min), since
    # sum/count can differ from the common value by rounding and leave ~1e-11 "advantages".
    hi = torch.full((n_groups,), -torch.inf, dtype=rewards.dtype).scatter_reduce(
        0, inverse, rewards, "amax"
    )
    lo = torch.full((n_groups,), torch.inf, dtype=rewards.dtype).scatter_reduce(
        0, inverse, rewards, "amin"
    )
    constant = hi == lo
    stats = {"zero_variance_group_frac": constant.to(rewards.dtype).mean().item()}
    if estimator == "reinforce_pp":
        flat = bool(rewards.max() == rewards.min())
        centred = torch.zeros_like(rewards) if flat else rewards - rewards.mean()
        return centred / (_batch_std(rewards) + eps), stats
    dev = torch.where(constant[inverse], 0.0, rewards - mean[inverse])
    # rloo: r_i - mean of the other n-1 members = n/(n-1) * (r_i - mean of all n).
    centred = dev * (n / (n - 1))[inverse] if estimator == "rloo" else dev
    if scaling == "none":
        return centred, stats
    if scaling == "batch":
        return centred / (_batch_std(rewards) + eps), stats
    sq = torch.zeros(n_groups, dtype=rewards.dtype).index_add_(0, inverse, dev * dev)
    std = torch.sqrt(sq / (n - 1))
    return centred / (std[inverse] + eps), stats


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


def turn_advantages(
    rewards: Tensor,
    turn: Tensor,
    turn_reward: Tensor,
    group_ids: Tensor,
    *,
    group_size: int | None,
    estimator: str = "grpo",
    scaling: str = "group",
    eps: float = 1e-6,
    input_ids: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Per-token advantages from each turn's reward-to-go (``rl.credit=turn|state``), ``[N, R]``.

    ``rewards`` ``[N]``: each trajectory's whole score. ``turn`` ``[N, R]``: the policy turn of
    each response token (1, 2, ...; 0 off the policy). ``turn_reward`` ``[N, R]``: the
    environment's reward for that token's turn. The rest of the score (verifier, format,
    reward functions: they read the last turn) is paid at the row's last turn. Turn ``k``'s
    return is ``G_k = sum_{j >= k} r_j`` (0 for a row that ended before ``k``), ``G_1`` being
    exactly ``rewards``; its tokens get :func:`group_advantages` of ``G_k`` over the group,
    so a later turn is judged by what it earned and not by the earlier turns' variance, and
    a row of one turn gets the sequence-level advantage bit for bit. Stats are turn 1's.

    ``input_ids`` ``[N, P + R]`` (``rl.credit=state``; the prompt, left-padded, then the
    response): turn ``k >= 2`` is judged only against the rows of its group that reached the
    same state, the same tokens before turn ``k`` (the prompt, the earlier turns and the tool
    results), so neither a row that ended earlier nor one that saw another tool result sets its
    baseline; ``estimator`` and ``scaling`` apply within the state (``scaling="batch"``: the std
    of the returns of the rows that share a state, over the batch). A state one row alone
    reached has no baseline: its turn gets advantage 0, as a group of equal rewards does
    (``later_turn_alone_frac``: the share of later turns that did; absent without any).
    """
    if turn.shape != turn_reward.shape or turn.dim() != 2 or turn.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"turn {tuple(turn.shape)} and turn_reward {tuple(turn_reward.shape)} must both be "
            f"[N={rewards.shape[0]}, R]"
        )
    if input_ids is not None and (
        input_ids.shape[0] != turn.shape[0] or input_ids.shape[1] < turn.shape[1]
    ):
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} must be [N, P + R] around turn {tuple(turn.shape)}"
        )
    idx = turn.to(torch.int64)
    k_max = max(int(idx.max()), 1) if idx.numel() else 1
    # per[i, k]: the environment's reward of row i's turn k (column 0 collects off-policy zeros)
    per = torch.zeros((idx.shape[0], k_max + 1), dtype=rewards.dtype)
    per.scatter_(1, idx, turn_reward.to(rewards.dtype))
    per[:, 0] = 0
    last = idx.max(1).values
    rest = rewards - per.sum(1)
    kw = dict(group_size=group_size, estimator=estimator, scaling=scaling, eps=eps)
    first, stats = group_advantages(rewards, group_ids, **kw)
    by_turn = [torch.zeros_like(rewards), first]
    alone, later = 0, 0
    for k in range(2, k_max + 1):
        to_go = per[:, k:].sum(1) + torch.where(last >= k, rest, 0.0)
        if input_ids is None:
            by_turn.append(group_advantages(to_go, group_ids, **kw)[0])
            continue
        states, shared = _states_before(k, idx, input_ids, group_ids)
        adv = torch.zeros_like(rewards)
        if bool(shared.any()):
            kw_any = {**kw, "group_size": None}  # states come in any size >= 2
            adv[shared] = group_advantages(to_go[shared], states[shared], **kw_any)[0]
        by_turn.append(adv)
        alone += int(((last >= k) & ~shared).sum())
        later += int((last >= k).sum())
    if input_ids is not None and later:
        stats["later_turn_alone_frac"] = alone / later
    table = torch.stack(by_turn, 1)  # [N, K + 1]; column 0 for tokens off the policy
    return table.gather(1, idx), stats


def _states_before(
    k: int, turn: Tensor, input_ids: Tensor, group_ids: Tensor
) -> tuple[Tensor, Tensor]:
    """Per row, an id shared by the rows of its group whose tokens before turn ``k`` (prompt
    included) are the same, and whether another row reached that state; rows that never reach
    turn ``k`` are in no state."""
    at_k = turn == k
    reached = at_k.any(1)
    # the first token of turn k (argmax returns the first maximum), in input_ids' columns
    end = at_k.to(torch.int64).argmax(1) + (input_ids.shape[1] - turn.shape[1])
    ids: dict[tuple[int, bytes], int] = {}
    states = torch.full_like(group_ids, -1)
    rows = input_ids.cpu().numpy()
    for i in reached.nonzero().squeeze(-1).tolist():
        key = (int(group_ids[i]), rows[i, : int(end[i])].tobytes())
        states[i] = ids.setdefault(key, len(ids))
    counts = torch.bincount(states[reached], minlength=len(ids))
    shared = reached.clone()
    shared[reached] = counts[states[reached]] >= 2
    return states, shared
