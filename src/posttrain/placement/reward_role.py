"""The reward role (scores groups, annotates advantages, hosts the environments) in a module
of its own: a Ray actor imports the module of the role it hosts, and this one needs neither the
policy's nor the rollout's code (transformers' modeling: ~1.8 s less CPU per actor start, about
half of it). ``roles.py`` re-exports it with the other roles."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from posttrain.config import PosttrainConfig
from posttrain.data.tasks import TaskItem
from posttrain.env.episode import Episode, TurnRequest
from posttrain.env.host import EpisodeHost
from posttrain.reward import RewardStage
from posttrain.reward.functions import functions_weight
from posttrain.reward.scores import RowScores
from posttrain.reward.stage import RewardResult
from posttrain.rollout.base import Rollout
from posttrain.rollout.multiturn import env_metrics


class RewardRole:
    """Scores complete groups and annotates advantages before dispatch."""

    def __init__(self, config: PosttrainConfig) -> None:
        self.config = cfg = config
        rw = cfg.reward
        self.stage = RewardStage(
            verifier=rw.verifier,
            format_weight=rw.format_weight,
            functions=list(rw.functions),
            group_size=cfg.rollout.n,
            estimator=cfg.rl.advantage_estimator,
            scaling=cfg.rl.reward_scaling,
            advantage_eps=cfg.rl.advantage_eps,
            shared_prefix_mask=rw.shared_prefix_mask,
            overlong_buffer=rw.overlong_buffer,
            overlong_penalty=rw.overlong_penalty,
            max_tokens=cfg.rollout.max_tokens,
            mask_truncated=rw.mask_truncated,
            dtype=_float_dtype(cfg.model.dtype),
            credit=cfg.rl.credit,
        )
        # The environments (env.name) run here, in the reward role's process.
        self.episodes = EpisodeHost(cfg, load_role_tokenizer(cfg)) if cfg.env.name else None

    def open_episodes(self, items: Sequence[TaskItem]) -> list[TurnRequest]:
        return self._episodes().open(items)

    def advance_episodes(self, outs: Sequence[Sequence[int]]) -> list[TurnRequest]:
        return self._episodes().advance(outs)

    def close_episodes(self) -> list[Episode]:
        return self._episodes().close()

    def close_tools(self) -> None:
        """At the end of the run: the tool workers of this process and every process their
        tools started are killed (a Ray actor is killed without running ``atexit``)."""
        if self.episodes is not None:
            from posttrain.env.tools import close_runners

            close_runners()

    def _episodes(self) -> EpisodeHost:
        if self.episodes is None:
            raise RuntimeError("multi-turn episodes need env.name (no environment configured)")
        return self.episodes

    def rollout_scores(self, rollout: Rollout, items: Sequence[TaskItem], step: int) -> RowScores:
        """Per-row scores only (dynamic sampling filters rounds on them before annotating), as
        the reward stands at training ``step`` (``reward.functions_anneal_steps``)."""
        rows = [items[i] for i in rollout.prompt_index.tolist()]
        weight = self._functions_weight(step)
        return self.stage.rollout_scores(rollout.batch, list(rollout.texts), rows, weight)

    def score(self, rollout: Rollout, items: Sequence[TaskItem], scores: RowScores) -> RewardResult:
        """The annotated batch, its metrics and per-row scores (row ``i`` of the rollout), from
        the rows' :meth:`rollout_scores` (scored once, as the reward stands at their step)."""
        rows = [items[i] for i in rollout.prompt_index.tolist()]
        result = self.stage(
            rollout.batch, list(rollout.texts), rows, truncated=rollout.truncated, scores=scores
        )
        result.metrics.update(env_metrics(result.batch))  # {} for single-turn rollouts
        return result

    def evaluate(
        self,
        completions: Sequence[str],
        items: Sequence[TaskItem],
        step: int,
        env: Tensor | None = None,
    ):
        """Held-out metrics and the per-row scores behind them (each row scored once), the
        reward as it stands at ``step``; ``env``: the rows' environment rewards (a multi-turn
        evaluation's ``env_reward`` column)."""
        env_rewards = None if env is None else env.tolist()
        weight = self._functions_weight(step)
        scores = self.stage.score(list(completions), list(items), env=env_rewards,
                                  functions_weight=weight)  # fmt: skip
        return self.stage.metrics_of(scores), scores

    def _functions_weight(self, step: int) -> float:
        return functions_weight(self.config.reward.functions_anneal_steps, step)


def load_role_tokenizer(cfg: PosttrainConfig):
    """The run's tokenizer (``model.tokenizer_path``, else the model folder's)."""
    from posttrain.model.loading import load_tokenizer

    return load_tokenizer(cfg.model.tokenizer_path or cfg.model.name_or_path)


def _float_dtype(name: str) -> torch.dtype:
    # Advantages stay float32 even for a bf16 policy: they are loss coefficients, not activations.
    return torch.float32 if name == "bfloat16" else getattr(torch, name)
