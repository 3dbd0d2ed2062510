"""The rollout result and the engine interface every sampler implements.

The training loop only sees ``RolloutEngine``: the built-in torch engine, or another backend
(e.g. vLLM on GPUs) that returns the same ``Rollout`` layout, plug in without changes to the loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from posttrain.data.trajectory import TrajectoryBatch


@dataclass(frozen=True)
class Rollout:
    """Sampled responses for a list of prompts, ``n`` per prompt, in the trajectory layout.

    ``batch``: prompts left-padded to P, responses right-padded to R (the longest response);
    ``response_mask`` marks generated tokens including a final EOS; ``rollout_logprobs`` holds the
    sampler's per-token logprobs (0 on padding); rows ``i*n .. i*n+n-1`` are prompt ``i``'s group.
    ``truncated[b]``: response ``b`` hit ``max_tokens`` without emitting a stop token.
    ``texts[b]``: the decoded response without special tokens (None without a tokenizer).
    """

    batch: TrajectoryBatch
    truncated: Tensor
    texts: tuple[str, ...] | None
    n: int

    def __post_init__(self) -> None:
        b = self.batch.batch_size
        if self.truncated.shape != (b,) or self.truncated.dtype != torch.bool:
            raise ValueError(f"Rollout.truncated must be bool [B={b}], got {self.truncated.shape}")
        if self.texts is not None and len(self.texts) != b:
            raise ValueError(f"Rollout.texts has {len(self.texts)} entries for B={b} rows")
        if self.n < 1 or b % self.n:
            raise ValueError(f"Rollout.n={self.n} does not divide the batch size {b}")

    @property
    def prompt_index(self) -> Tensor:
        """``[B]`` index into the prompt list each row answers (``row // n``)."""
        return torch.arange(self.batch.batch_size) // self.n

    @property
    def response_lengths(self) -> Tensor:
        """``[B]`` generated tokens per row, the EOS included."""
        return self.batch.response_mask.sum(-1)


@runtime_checkable
class RolloutEngine(Protocol):
    """A sampler of responses with per-token logprobs.

    ``generate`` samples ``n`` responses for every prompt (token ids, no padding). Same ``seed``,
    same prompts, same weights -> same samples. Group ids: ``group_ids[i]`` for prompt ``i`` if
    given, else ``group_id_offset + i``; sample ids are ``sample_id_offset + row``.

    ``sync_weights`` brings the engine's weights up to date with the policy after an update:
    pass the policy module, a state dict, or a sync's buckets one call each (``final=False``
    for all but the last). An engine that samples with the policy module itself has nothing to
    copy.
    """

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        group_ids: Sequence[int] | None = None,
        group_id_offset: int = 0,
        sample_id_offset: int = 0,
    ) -> Rollout: ...

    def sync_weights(
        self, source: nn.Module | Mapping[str, Tensor], *, final: bool = True
    ) -> None: ...
