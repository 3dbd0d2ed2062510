"""The rollout result and the one engine interface every sampler implements.

Callers (the rollout role, weight sync, the multi-turn driver, placement) use only what
:class:`RolloutEngine` declares: they never reach into an engine's model, cache or private
methods, so the torch engine, the static (CUDA-graph) engine and an engine in another process
(vLLM) are interchangeable behind it. :func:`assemble_rollout` is the one place a single-turn
``Rollout`` is laid out from sampled ids, so every engine returns the same layout.

Log-prob semantics are part of the contract: ``rollout_logprobs`` are the log-probs of the
distribution actually sampled (after temperature and top-p renormalisation; 0 under greedy
decoding), of the sampled ids, stop token included. An engine whose library reports another
quantity converts it or declares other semantics, which preflight refuses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from posttrain.data.trajectory import TrajectoryBatch
from posttrain.rollout.capabilities import EngineCapabilities

if TYPE_CHECKING:
    from posttrain.env.episode import TurnRequest


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
class WeightReceiver(Protocol):
    """An engine's side of a weight sync: ``begin``, any number of ``load``, ``end``.

    Full-weight syncs and adapter-only syncs (whose adapters the rollout role merges onto its
    base weights, ``placement/weight_sync.py``) both feed it named tensors under the plain
    model's names, so an engine in another process implements these calls and nothing of the
    sync's bucketing or merging. An engine that applies adapters itself (vLLM's LoRA path)
    says which modules' in :meth:`adapter_modules` and gets ``<module>.lora_A`` /
    ``<module>.lora_B`` as they are.
    """

    def names(self) -> Mapping[str, str]:
        """Every weight name the engine takes -> its canonical name (tied weights share one):
        what a sync must cover for the engine to hold the policy's weights."""
        ...

    def adapter_modules(self) -> frozenset[str] | None:
        """The modules whose LoRA adapters the engine takes unmerged (None: full weights)."""
        ...

    def begin(self) -> None:
        """A sync starts (an engine may pause sampling or open a staging area here)."""
        ...

    def load(self, weights: Mapping[str, Tensor]) -> None:
        """Take part of the weights (one bucket, or one merged adapter weight), in place;
        names and shapes must match the engine's model (else one-line ``ValueError``)."""
        ...

    def end(self) -> int:
        """The sync is complete: drop state computed with the old weights (prefix caches) and
        move the weight version on once; returns the new version."""
        ...


@runtime_checkable
class RolloutEngine(Protocol):
    """A sampler of responses with per-token log-probs: everything callers use of an engine.

    Same ``seed``, same prompts, same weights -> same samples. Group ids: ``group_ids[i]`` for
    prompt ``i`` if given, else ``group_id_offset + i``; sample ids are ``sample_id_offset + row``.
    """

    #: Declared once per engine class (``rollout.capabilities``); preflight reads it torch-free.
    capabilities: EngineCapabilities
    #: The ids that end a response or a turn (one owner: the engine decides when it stops).
    stop_token_ids: tuple[int, ...]
    #: How many syncs the engine has taken; a rollout records which weights sampled it.
    weight_version: int

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
    ) -> Rollout:
        """``n`` responses per prompt (token ids in, no padding), laid out by
        :func:`assemble_rollout`."""
        ...

    def generate_turns(
        self, requests: Sequence[TurnRequest], *, temperature: float, top_p: float, seed: int
    ) -> list[tuple[list[int], list[float]]]:
        """One turn per request of a multi-turn rollout: ids (ending at a stop id unless they
        fill ``max_new_tokens``) and their log-probs. Requests that are all first turns open a
        new turn session seeded with ``seed`` (only with ``capabilities.multi_turn``)."""
        ...

    def end_turns(self) -> None:
        """The multi-turn rollout is over: free the turn session's caches."""
        ...

    def shares(self, module: nn.Module) -> bool:
        """Whether the engine samples with ``module`` itself (then a sync copies nothing)."""
        ...

    def weight_receiver(self) -> WeightReceiver:
        """Where syncs put the policy's weights (:class:`WeightReceiver`)."""
        ...


def _as_id_list(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def stop_and_pad_ids(
    model: nn.Module,
    tokenizer=None,
    stop_token_ids: Sequence[int] | None = None,
    pad_token_id: int | None = None,
) -> tuple[tuple[int, ...], int]:
    """An engine's stop ids (given, else the tokenizer's, the generation config's and the model
    config's EOS ids) and pad id (given, else the tokenizer's, the config's, the first stop id):
    one rule, so every engine over the same model stops at the same ids."""
    config = model.config
    if stop_token_ids is None:
        ids = _as_id_list(getattr(tokenizer, "eos_token_id", None))
        gen = getattr(model, "generation_config", None)
        ids += _as_id_list(getattr(gen, "eos_token_id", None))
        ids += _as_id_list(getattr(config, "eos_token_id", None))
        if not ids:
            raise ValueError(
                "no EOS token id found on the tokenizer or model config; pass "
                "stop_token_ids explicitly (an empty list samples to max_tokens)"
            )
        stop_token_ids = ids
    stops = tuple(dict.fromkeys(int(i) for i in stop_token_ids))
    if pad_token_id is None:
        pad_token_id = getattr(tokenizer, "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = getattr(config, "pad_token_id", None)
    if pad_token_id is None:
        pad_token_id = stops[0] if stops else 0
    return stops, int(pad_token_id)


def check_generate_args(
    prompts: Sequence[Sequence[int]],
    n: int,
    max_tokens: int,
    vocab_size: int,
    group_ids: Sequence[int] | None,
    group_id_offset: int,
) -> list[list[int]]:
    """The prompts as lists of ints, after the checks every engine's ``generate`` makes."""
    for name, v in (("n", n), ("max_tokens", max_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"rollout.{name} must be a positive integer, got {v!r}")
    if len(prompts) == 0:
        raise ValueError("generate: no prompts given")
    out = []
    for i, p in enumerate(prompts):
        ids = [int(t) for t in p]
        if not ids:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise ValueError(
                f"prompt {i} has token ids outside [0, {vocab_size}); wrong tokenizer?"
            )
        out.append(ids)
    if group_ids is not None and len(group_ids) != len(prompts):
        raise ValueError(f"group_ids has {len(group_ids)} entries for {len(prompts)} prompts")
    if group_ids is not None and group_id_offset:
        raise ValueError("pass either group_ids or group_id_offset, not both")
    return out


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """``(ids, attention_mask)`` of shape ``[len(prompts), longest]``, padding on the left."""
    p = max(len(x) for x in prompts)
    ids = torch.full((len(prompts), p), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), p), dtype=torch.long)
    for i, x in enumerate(prompts):
        ids[i, p - len(x) :] = torch.as_tensor(x)
        mask[i, p - len(x) :] = 1
    return ids, mask


def assemble_rollout(
    prompts: Sequence[Sequence[int]],
    n: int,
    tokens: Tensor,
    logprobs: Tensor,
    lengths: Tensor,
    stopped: Tensor,
    *,
    pad_token_id: int,
    tokenizer=None,
    group_ids: Sequence[int] | None = None,
    group_id_offset: int = 0,
    sample_id_offset: int = 0,
) -> Rollout:
    """The one layout of a single-turn ``Rollout`` from what an engine sampled.

    ``tokens`` / ``logprobs`` ``[B, R]`` (``B = len(prompts) * n``, row ``i*n + j`` is prompt
    ``i``'s sample ``j``; anything past a row's length is ignored), ``lengths`` ``[B]`` the
    sampled ids per row (stop token included), ``stopped`` ``[B]`` whether the row ended at a
    stop id. Returned on the CPU, texts decoded with ``tokenizer`` when given.
    """
    b, r = tokens.shape
    tokens, logprobs, lengths, stopped = (x.cpu() for x in (tokens, logprobs, lengths, stopped))
    response_mask = torch.arange(r)[None, :] < lengths[:, None]
    tokens = torch.where(response_mask, tokens, pad_token_id)
    logprobs = torch.where(response_mask, logprobs, 0.0)
    if group_ids is None:
        gid = torch.arange(len(prompts), dtype=torch.int64) + group_id_offset
    else:
        gid = torch.as_tensor([int(g) for g in group_ids], dtype=torch.int64)
    prompt_ids, prompt_mask = left_pad(prompts, pad_token_id)
    input_ids = torch.cat([prompt_ids.repeat_interleave(n, 0), tokens], dim=1)
    attention_mask = torch.cat([prompt_mask.repeat_interleave(n, 0), response_mask.long()], 1)
    batch = TrajectoryBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        group_ids=gid.repeat_interleave(n),
        sample_ids=torch.arange(b, dtype=torch.int64) + sample_id_offset,
        rollout_logprobs=logprobs,
    )
    texts = None
    if tokenizer is not None:
        # One tolist for the whole batch: per-row tensor slicing cost more than decoding.
        seqs = [row[:length] for row, length in zip(tokens.tolist(), lengths.tolist(), strict=True)]
        texts = tuple(tokenizer.batch_decode(seqs, skip_special_tokens=True))
    return Rollout(batch=batch, truncated=~stopped, texts=texts, n=n)
