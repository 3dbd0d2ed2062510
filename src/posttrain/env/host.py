"""The environment side of a multi-turn rollout, held by the reward role (its process, its actor).

Environments and tools run next to the verifiers, never in the policy's process: a tool that
hangs, forks or imports something heavy cannot touch the trainer or the sampler. The driver
alternates one call here (:meth:`EpisodeHost.advance`) with one batched turn of the rollout
engine, so both sides stay in their own processes under Ray and in one under local placement.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from posttrain.config import ConfigError, PosttrainConfig
from posttrain.data.tasks import TaskItem
from posttrain.env.base import (
    environment_info_keys,
    environment_tools,
    load_environment,
    make_environment,
)
from posttrain.env.episode import Episode, EpisodeBatch, EpisodeLimits, TurnRequest
from posttrain.env.render import check_template

log = logging.getLogger("posttrain")


def env_item(item: TaskItem) -> dict[str, Any]:
    """The row an environment's ``reset`` reads: the prompt, the gold answer and the metadata."""
    return {**item.meta, "prompt": item.prompt, "answer": item.answer}


def _check_context(config: PosttrainConfig) -> None:
    """``env.max_context`` must fit the model's positions (one line naming both otherwise)."""
    from transformers import AutoConfig

    model = AutoConfig.from_pretrained(config.model.name_or_path, local_files_only=True)
    limit = getattr(model.get_text_config(), "max_position_embeddings", None)
    if limit is not None and config.env.max_context > int(limit):
        raise ConfigError(
            f"env.max_context={config.env.max_context} exceeds the {limit} positions of the "
            f"model at {config.model.name_or_path}; lower env.max_context to at most {limit}"
        )


class EpisodeHost:
    """Loads ``env.name`` once, checks the chat template against it, reads its ``info_keys``
    once (so every rollout of the run reports the same keys, hence the same batch columns), and
    runs the episodes of one rollout at a time (:class:`~posttrain.env.episode.EpisodeBatch`)."""

    def __init__(self, config: PosttrainConfig, tokenizer: Any) -> None:
        env = config.env
        self.tokenizer = tokenizer
        _check_context(config)
        self.factory = load_environment(env.name, env.tools)
        probe = make_environment(self.factory, env.name)
        check_template(tokenizer, environment_tools(probe))
        self.limits = EpisodeLimits(env.max_turns, config.rollout.max_tokens, env.max_context)
        self.name = f"environment {env.name!r}"
        self.info_keys = environment_info_keys(probe, self.name)
        self._batch: EpisodeBatch | None = None
        self._warned = False

    def open(self, items: Sequence[TaskItem]) -> list[TurnRequest]:
        """Reset one environment per row; the first turn of each trajectory."""
        rows = [env_item(it) for it in items]
        self._batch = EpisodeBatch(
            rows, self.factory, self.tokenizer, self.limits, name=self.name,
            info_keys=self.info_keys,
        )  # fmt: skip
        return self._batch.requests()

    def advance(self, outs: Sequence[Sequence[int]]) -> list[TurnRequest]:
        """Append the sampled turns, step the environments; the next turns (empty: all done)."""
        if self._batch is None:
            raise RuntimeError("advance_episodes before open_episodes")
        self._batch.advance(outs)
        dropped = self._batch.dropped()
        if dropped and not self._warned:  # once a run; every one is counted in the metrics
            self._warned = True
            log.warning(
                "%s; raise env.max_context to keep observations (each dropped one is counted: "
                "train/env/dropped_observations_mean; this warning is shown once)",
                dropped[0],
            )
        return self._batch.requests()

    def close(self) -> list[Episode]:
        """The finished episodes of the rollout (the host forgets them)."""
        if self._batch is None:
            raise RuntimeError("close_episodes before open_episodes")
        episodes, self._batch = self._batch.episodes(), None
        return episodes
