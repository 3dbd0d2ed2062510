"""The reward stage: score every rollout row, then annotate complete groups before dispatch.

Reward of one row (a response to a task item)::

    reward = verifier(completion, item)                      # in [0, 1]; 1 = correct
           + format_weight * follows_format(completion)      # 0/1: one non-empty \\boxed{}
           + sum(fn(item.prompt, completion, item.answer, item.meta) for fn in functions)
           + env_reward                                      # multi-turn: the environment's
           - overlong_penalty * min(1, max(0, L - (max_tokens - overlong_buffer)) / overlong_buffer)

``env_reward`` is what a multi-turn rollout's environment gave the trajectory (the sum of its
``EnvStep.reward`` values, 0 when it gave none; the ``env_reward`` batch column), summed like a
reward function's value. The last term (DAPO's soft overlong punishment, on when ``overlong_buffer >
0``) needs the response's token length ``L``, so it applies to rollout batches, not to held-out
scoring. Accuracy counts the rows whose verifier score is 1. Advantages come from
:func:`posttrain.algorithm.annotators.advantage.group_advantages` over the total reward, with every
group complete (dispatch may split groups later; nothing after this stage may recompute group
statistics). Shared-prefix masking and ``mask_truncated``, when on, narrow ``response_mask`` after
the advantages are computed.

A reward component that raises (any exception, see
:func:`~posttrain.reward.functions.checked_reward`), returns a non-number, gives NaN/inf or a
magnitude above :data:`~posttrain.reward.functions.MAX_ABS_REWARD` stops the run with
:class:`RewardError`, which names the row, its sample id, item id and a prompt excerpt, and the
component.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.algorithm.annotators.advantage import (
    group_advantages,
    shared_prefix_mask,
    turn_advantages,
)
from posttrain.algorithm.primitives.choices import AdvantageEstimator, RewardScaling
from posttrain.data.tasks.base import TaskItem
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.reward.extract import follows_format
from posttrain.reward.functions import (
    MAX_ABS_REWARD,
    RewardError,
    RewardFunction,
    checked_reward,
    load_reward_function,
)
from posttrain.reward.scores import RowScores
from posttrain.reward.verifiers import VerifierName, get_verifier

#: The batch column of a multi-turn rollout holding each row's environment reward.
ENV_REWARD_COLUMN = "env_reward"
#: Per-token columns of a multi-turn rollout: each token's policy turn (1, 2, ...; 0 off the
#: policy) and that turn's environment reward, read by ``credit="turn"``.
TURN_COLUMN = "env_turn"
TURN_REWARD_COLUMN = "env_turn_reward"


@dataclass(frozen=True)
class RewardResult:
    """The annotated batch (``rewards``, ``advantages``, maybe narrowed mask) and metrics."""

    batch: TrajectoryBatch
    metrics: dict[str, float]
    scores: RowScores


class RewardStage:
    """Scores rollouts and runs the advantage annotators; built from plain config values.

    ``verifier``: ``"exact"`` | ``"math"`` | ``"last_number"`` | ``"reasoning_gym"`` (see
    :mod:`posttrain.reward.verifiers`). ``format_weight``: added when the completion has exactly
    one non-empty ``\\boxed{}`` (meant for the ``chat`` template, whose system prompt asks for
    it). ``functions``: ``"module:function"`` specs of user reward functions. ``group_size``:
    responses per prompt. ``estimator``, ``scaling``, ``advantage_eps``: see
    :func:`~posttrain.algorithm.annotators.advantage.group_advantages`. ``shared_prefix_mask``:
    mask each group's common response prefix. ``overlong_buffer``, ``overlong_penalty``,
    ``max_tokens``: the soft overlong punishment (module doc). ``mask_truncated``: clear the
    response mask of rows that hit the length bound. ``dtype``: dtype of the ``rewards`` /
    ``advantages`` written to the batch (scores and advantages are computed in float64 first).
    """

    def __init__(
        self,
        *,
        verifier: VerifierName,
        format_weight: float,
        functions: Sequence[str],
        group_size: int,
        estimator: AdvantageEstimator = "grpo",
        scaling: RewardScaling = "group",
        advantage_eps: float = 1e-6,
        shared_prefix_mask: bool = False,
        overlong_buffer: int = 0,
        overlong_penalty: float = 1.0,
        max_tokens: int | None = None,
        mask_truncated: bool = False,
        dtype: torch.dtype = torch.float32,
        credit: str = "trajectory",
    ) -> None:
        if credit not in ("trajectory", "turn", "state"):
            raise ValueError(
                f"reward credit must be 'trajectory', 'turn' or 'state', got {credit!r}"
            )
        self.credit = credit
        self.verifier_name = verifier
        self._verify = get_verifier(verifier)
        if not math.isfinite(format_weight):
            raise ValueError(f"reward format_weight must be finite, got {format_weight}")
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2:
            raise ValueError(f"reward group_size must be an int >= 2, got {group_size!r}")
        if not advantage_eps > 0:
            raise ValueError(f"reward advantage_eps must be > 0, got {advantage_eps}")
        if overlong_buffer and (max_tokens is None or not 0 < overlong_buffer <= max_tokens):
            raise ValueError(
                f"reward overlong_buffer={overlong_buffer} must lie in 1..max_tokens "
                f"(max_tokens={max_tokens})"
            )
        if not (math.isfinite(overlong_penalty) and overlong_penalty > 0):
            raise ValueError(
                f"reward overlong_penalty must be finite and > 0, got {overlong_penalty}"
            )
        if not dtype.is_floating_point:
            raise ValueError(f"reward dtype must be floating, got {dtype}")
        if isinstance(functions, str):
            raise ValueError("reward functions must be a list of 'module:function' strings")
        self.format_weight = float(format_weight)
        self.functions: tuple[RewardFunction, ...] = tuple(
            load_reward_function(s) for s in functions
        )
        specs = [f.spec for f in self.functions]
        if len(set(specs)) != len(specs):
            raise ValueError(f"reward functions list a function twice: {specs}")
        self.group_size = group_size
        self.estimator, self.scaling = estimator, scaling
        self.advantage_eps = float(advantage_eps)
        self.shared_prefix_mask = shared_prefix_mask
        self.overlong_buffer, self.overlong_penalty = overlong_buffer, float(overlong_penalty)
        self.max_tokens = max_tokens
        self.mask_truncated = mask_truncated
        self.dtype = dtype

    def score(
        self,
        completions: Sequence[str],
        items: Sequence[TaskItem],
        sample_ids: Sequence[int] | None = None,
        env: Sequence[float] | None = None,
        functions_weight: float = 1.0,
    ) -> RowScores:
        """Score rows ``i`` = (``completions[i]``, ``items[i]``); no group logic (validation).

        ``env``: each row's environment reward (multi-turn rollouts), a term of its total.
        ``functions_weight``: what the reward functions' sum counts with in the total
        (:func:`functions_weight`); each function's own values are kept unweighted.
        """
        if len(completions) != len(items):
            raise ValueError(
                f"reward stage: {len(completions)} completions but {len(items)} task items"
            )
        ids = list(range(len(items))) if sample_ids is None else [int(s) for s in sample_ids]
        if len(ids) != len(items):
            raise ValueError(f"reward stage: {len(ids)} sample ids for {len(items)} rows")
        if env is not None and len(env) != len(items):
            raise ValueError(f"reward stage: {len(env)} environment rewards for {len(items)} rows")
        ver, fmt, total, env_vals = [], [], [], []
        fn_vals: dict[str, list[float]] = {f.spec: [] for f in self.functions}
        for i, (completion, item) in enumerate(zip(completions, items, strict=True)):
            where = _row_name(i, ids[i], item)
            v = checked_reward(
                lambda c=completion, it=item: self._verify(c, it),
                f"verifier {self.verifier_name!r}",
                where,
            )
            ok = follows_format(completion)
            r = v + (self.format_weight if ok else 0.0)
            for f in self.functions:
                x = checked_reward(
                    lambda f=f, c=completion, it=item: f(it.prompt, c, it.answer, it.meta),
                    f"reward function {f.spec!r}",
                    where,
                )
                fn_vals[f.spec].append(x)
                r += functions_weight * x
            if env is not None:
                x = checked_reward(lambda e=env[i]: e, "the environment's reward", where)
                env_vals.append(x)
                r += x
            if not abs(r) <= MAX_ABS_REWARD:  # NaN fails too
                raise RewardError(
                    f"total reward is {r:g} on {where}: it must satisfy |reward| <= "
                    f"{MAX_ABS_REWARD:g} (larger ones overflow the group statistics)"
                )
            ver.append(v)
            fmt.append(ok)
            total.append(r)
        f64 = torch.float64
        verifier = torch.tensor(ver, dtype=f64)
        return RowScores(
            rewards=torch.tensor(total, dtype=f64),
            verifier=verifier,
            correct=verifier >= 1.0,
            format_ok=torch.tensor(fmt, dtype=torch.bool),
            functions={k: torch.tensor(v, dtype=f64) for k, v in fn_vals.items()},
            env=None if env is None else torch.tensor(env_vals, dtype=f64),
            functions_weight=functions_weight,
        )

    @staticmethod
    def metrics_of(s: RowScores) -> dict[str, float]:
        """The held-out metrics of already-scored rows."""
        return {
            "accuracy": _mean(s.correct),
            "reward_mean": _mean(s.rewards),
            "format_frac": _mean(s.format_ok),
        }

    def _overlong(self, batch: TrajectoryBatch) -> Tensor:
        lengths = batch.response_mask.sum(1).to(torch.float64)
        return self.overlong_penalty * overlong_fraction(
            lengths, self.max_tokens, self.overlong_buffer
        )

    def _advantages(self, batch: TrajectoryBatch, rewards: Tensor) -> tuple[Tensor, dict]:
        """``[B]`` (``credit="trajectory"``) or per-turn ``[B, R]`` (``"turn"``, ``"state"``)."""
        kw = dict(group_size=self.group_size, estimator=self.estimator, scaling=self.scaling,
                  eps=self.advantage_eps)  # fmt: skip
        if self.credit == "trajectory":
            return group_advantages(rewards, batch.group_ids, **kw)
        turn, per = batch.columns.get(TURN_COLUMN), batch.columns.get(TURN_REWARD_COLUMN)
        if turn is None or per is None:
            raise ValueError(
                f"reward stage: credit={self.credit!r} needs a multi-turn rollout's per-turn "
                f"columns ({TURN_COLUMN!r}, {TURN_REWARD_COLUMN!r}); set env.name or "
                "credit='trajectory'"
            )
        ids = batch.input_ids if self.credit == "state" else None
        return turn_advantages(rewards, turn, per, batch.group_ids, **kw, input_ids=ids)

    def rollout_scores(
        self,
        batch: TrajectoryBatch,
        completions: Sequence[str],
        items: Sequence[TaskItem],
        functions_weight: float = 1.0,
    ) -> RowScores:
        """Score rollout rows, the overlong punishment included (it needs token lengths)."""
        n = batch.batch_size
        if len(completions) != n or len(items) != n:
            raise ValueError(
                f"reward stage: batch has {n} rows but got {len(completions)} completions and "
                f"{len(items)} task items (one each per row)"
            )
        _check_groups_share_items(batch.group_ids, items)
        env = batch.columns.get(ENV_REWARD_COLUMN)
        env = None if env is None else env.tolist()
        scores = self.score(completions, items, batch.sample_ids.tolist(), env, functions_weight)
        if not self.overlong_buffer:
            return scores
        return dataclasses.replace(scores, rewards=scores.rewards - self._overlong(batch))

    def __call__(
        self,
        batch: TrajectoryBatch,
        completions: Sequence[str],
        items: Sequence[TaskItem],
        *,
        truncated: Tensor | None = None,
        scores: RowScores | None = None,
    ) -> RewardResult:
        """Annotate a rollout batch whose groups are all complete (row ``i`` <-> ``items[i]``).

        ``scores``: the rows' :meth:`rollout_scores` when the caller already has them (dynamic
        sampling scores every round before it keeps rows), so no reward component runs twice.

        ``truncated`` (``[B]`` bool, optional): rows that hit the length bound. Metrics:
        ``reward/mean``, ``reward/std`` (population std over the batch), ``reward/accuracy``,
        ``reward/verifier_mean``, ``reward/format_frac``, ``reward/response_length_mean``
        (loss tokens before any shared-prefix masking), ``reward/fn/<spec>_mean`` per user
        function (its own values) and ``reward/functions_weight`` (what their sum counted
        with), ``reward/env_mean`` for a multi-turn rollout (the environment's reward), the
        annotator's stats as ``reward/<name>`` (``zero_variance_group_frac``),
        ``reward/truncated_frac`` when ``truncated`` is given, and
        ``reward/shared_prefix_masked_frac`` (share of loss tokens masked) when masking is on,
        ``reward/overlong_penalty_mean`` when the overlong punishment is on. ``mask_truncated``
        needs ``truncated``; the rows it drops are the ``reward/truncated_frac`` share.
        """
        n = batch.batch_size
        if len(completions) != n or len(items) != n:
            raise ValueError(
                f"reward stage: batch has {n} rows but got {len(completions)} completions and "
                f"{len(items)} task items (one each per row)"
            )
        if scores is None:
            scores = self.rollout_scores(batch, completions, items)
        elif scores.rewards.shape != (n,):
            raise ValueError(f"reward stage: scores have {scores.rewards.shape} rows, batch {n}")
        lengths = batch.response_mask.sum(1).to(torch.float64)
        adv, stats = self._advantages(batch, scores.rewards)
        changes: dict[str, Tensor] = {
            "rewards": scores.rewards.to(self.dtype),
            "advantages": adv.to(self.dtype),
        }
        metrics = {
            "reward/mean": _mean(scores.rewards),
            "reward/std": float(scores.rewards.std(unbiased=False)),
            "reward/accuracy": _mean(scores.correct),
            "reward/verifier_mean": _mean(scores.verifier),
            "reward/format_frac": _mean(scores.format_ok),
            "reward/response_length_mean": _mean(lengths),
        }
        metrics.update({f"reward/fn/{k}_mean": _mean(v) for k, v in scores.functions.items()})
        if scores.functions:
            metrics["reward/functions_weight"] = scores.functions_weight
        if scores.env is not None:
            metrics["reward/env_mean"] = _mean(scores.env)
        metrics.update({f"reward/{k}": float(v) for k, v in stats.items()})
        if truncated is not None:
            if truncated.shape != (n,):
                raise ValueError(f"reward stage: truncated must be [B={n}], got {truncated.shape}")
            metrics["reward/truncated_frac"] = _mean(truncated.to(torch.bool))
        if self.overlong_buffer:
            metrics["reward/overlong_penalty_mean"] = _mean(self._overlong(batch))
        mask = batch.response_mask
        if self.shared_prefix_mask:
            mask = shared_prefix_mask(batch.response_ids, mask, batch.group_ids)
            before = int(batch.response_mask.sum())
            removed = before - int(mask.sum())
            metrics["reward/shared_prefix_masked_frac"] = removed / before if before else 0.0
        if self.mask_truncated:
            if truncated is None:
                raise ValueError("reward stage: mask_truncated needs the rollout's truncated flags")
            mask = mask & ~truncated.to(torch.bool).unsqueeze(1)
        if mask is not batch.response_mask:
            changes["response_mask"] = mask
        return RewardResult(batch=batch.replace(**changes), metrics=metrics, scores=scores)


def overlong_fraction(lengths: Tensor, max_tokens: int, buffer: int) -> Tensor:
    """DAPO's soft overlong ramp: 0 up to ``max_tokens - buffer`` tokens, then rising linearly
    to 1 at ``max_tokens`` (``min(1, max(0, L - (max_tokens - buffer)) / buffer)``)."""
    return ((lengths - (max_tokens - buffer)) / buffer).clamp(0.0, 1.0)


def _row_name(index: int, sample_id: int, item: TaskItem) -> str:
    excerpt = item.prompt if len(item.prompt) <= 60 else item.prompt[:57] + "..."
    return f"row {index} (sample_id {sample_id}, item {item.item_id}, prompt {excerpt!r})"


def _check_groups_share_items(group_ids: Tensor, items: Sequence[TaskItem]) -> None:
    """Rows of one group answer one task item; a mismatch means rows and items are misaligned."""
    first: dict[int, int] = {}
    for i, g in enumerate(group_ids.tolist()):
        j = first.setdefault(g, i)
        if (items[i].prompt, items[i].answer) != (items[j].prompt, items[j].answer):
            raise ValueError(
                f"reward stage: rows {j} and {i} share group_id {g} but have different task items "
                f"({items[j].item_id} vs {items[i].item_id}); rows and items are misaligned"
            )


def _mean(t: Tensor) -> float:
    return float(t.to(torch.float64).mean()) if t.numel() else 0.0
