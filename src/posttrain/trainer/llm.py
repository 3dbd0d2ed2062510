"""LLMTrainer: the language-model layer on the trainer core — when π_old is armed, token counts.

An objective that declares an ``old_logp_cache`` measures importance ratios against the policy
that produced the collected batch (``algorithm/primitives/old_logp.py`` says what it sees). This
layer decides *when*: once per collected batch, before its first update.

- One mini-batch (each row is updated once): the cache follows the policy; π_old is the update's
  own forward, detached, so no scoring forward runs and the first ratio is exactly 1.
- Several mini-batches: π_old is scored once, frozen, in micro-batches of ``micro_batch_size``.
  With ``certified_deterministic_forward`` the first micro-batch is scored a second time and must
  match bit for bit, which is what makes the first update's ratio exactly 1 there too.

Every update is refused before any forward unless the cache was armed for exactly its rows.

``shared_prefix`` (``rl.shared_prefix``) is in force in every forward this trainer runs (update,
reference, π_old capture): each distinct prompt of a micro-batch is encoded once
(``data/prefix.py``), and micro-batches hold whole groups where they can (``accumulate.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from posttrain.algorithm.primitives.objective import MetricReduce, Reduction
from posttrain.algorithm.primitives.old_logp import PiOldError
from posttrain.data.padding import padding_counts, row_lengths
from posttrain.data.prefix import (
    MODES,
    SharedPrefixUnsupported,
    unsupported_reason,
    use_shared_prefix,
)
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.placement import heap
from posttrain.trainer import distributed as dp
from posttrain.trainer.accumulate import group_chunks, group_order, row_chunks, token_chunks
from posttrain.trainer.core import Trainer
from posttrain.trainer.errors import NondeterministicForwardError, PiOldNotCapturedError
from posttrain.trainer.sharding import ghost_rows, lockstep_ghosts


def update_micro_slices(
    batch: TrajectoryBatch,
    micro_batch_size: int,
    micro_batch_tokens: int | None,
    shared_prefix: str,
    keeps_groups: bool,
) -> list[slice] | list[list[int]]:
    """The rows of each micro-batch of an update of ``batch`` (:meth:`LLMTrainer.micro_slices`;
    a reference scoring on the data side cuts the collected batch the same way)."""
    if micro_batch_tokens is not None:
        prompt, response = row_lengths(batch)
        groups = None if shared_prefix == "off" else batch.group_ids.tolist()
        return token_chunks(prompt, response, micro_batch_tokens, groups)
    if not keeps_groups:
        return row_chunks(len(batch), micro_batch_size)
    ids = batch.group_ids.tolist()
    order = group_order(ids)
    chunks = group_chunks([ids[i] for i in order], micro_batch_size)
    if order == sorted(order):
        return chunks
    return [order[c] for c in chunks]


class LLMTrainer(Trainer):
    """A :class:`Trainer` for causal language models trained on :class:`TrajectoryBatch`.

    ``certified_deterministic_forward`` claims that scoring the same rows twice is bit-identical;
    a frozen π_old is then captured in exactly the micro-batches of the first update, and every
    mini-batch must be a multiple of ``micro_batch_size``. ``shared_prefix``: ``auto``, ``on``
    (refused here if the model cannot share) or ``off``; see the module docstring.
    ``micro_batch_tokens`` (``rl.micro_batch_tokens``): micro-batches packed by forwarded tokens
    instead of ``micro_batch_size`` rows (``accumulate.token_chunks``); TOKEN_SUM objectives only.
    """

    def __init__(
        self,
        *args: Any,
        certified_deterministic_forward: bool = False,
        shared_prefix: str = "auto",
        micro_batch_tokens: int | None = None,
        **kw: Any,
    ):
        if shared_prefix not in MODES:
            raise ValueError(f"shared_prefix must be one of {MODES}, got {shared_prefix!r}")
        self.shared_prefix = shared_prefix
        super().__init__(*args, **kw)
        if micro_batch_tokens is not None and (
            micro_batch_tokens < 1
            or self.objective.reduction is not Reduction.TOKEN_SUM
            or certified_deterministic_forward
        ):
            raise ValueError(
                f"micro_batch_tokens={micro_batch_tokens} needs a value >= 1, a TOKEN_SUM "
                "objective and no certified_deterministic_forward (π_old is scored in row chunks)"
            )
        self.micro_batch_tokens = micro_batch_tokens
        self.certified_deterministic_forward = certified_deterministic_forward
        heap.pin_thresholds()  # the process trains: freed step tensors stay for the next step
        reason = unsupported_reason(self.forward_model) if shared_prefix == "on" else None
        if reason is not None:
            raise SharedPrefixUnsupported(
                f"rl.shared_prefix=on but {reason}; set rl.shared_prefix=auto or off"
            )

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        with super().forward_context(), use_shared_prefix(self.shared_prefix):
            yield

    @property
    def keeps_groups(self) -> bool:
        """Rows may be regrouped by prompt within an optimizer step (here and by the rank
        dispatch): sharing can be on and the update stays exact under any such cut. TOKEN_SUM
        makes it so; a MEAN objective, or a π_old certified in the update's own micro-batches,
        keeps the plain row chunks."""
        return (
            self.shared_prefix != "off"
            and self.objective.reduction is Reduction.TOKEN_SUM
            and not self.certified_deterministic_forward
        )

    def micro_slices(self, batch: TrajectoryBatch) -> list[slice] | list[list[int]]:
        """Token-budget micro-batches (``rl.micro_batch_tokens``), else whole groups per
        micro-batch where :attr:`keeps_groups`: a group's rows are brought together (a
        permutation within one optimizer step) and groups packed into micro-batches
        (``group_chunks``)."""
        return update_micro_slices(
            batch, self.micro_batch_size, self.micro_batch_tokens, self.shared_prefix,
            self.keeps_groups,
        )  # fmt: skip

    @property
    def old_logp_cache(self):
        return self.objective.old_logp_cache

    def begin_collected(self, collected: TrajectoryBatch, minis: Sequence[TrajectoryBatch]):
        heap.trim()  # what the rollout freed leaves before the update allocates
        if self.certified_deterministic_forward:
            sizes = [len(m) for m in minis]
            if any(n % self.micro_batch_size for n in sizes):
                raise ValueError(
                    f"certified_deterministic_forward needs every mini-batch size {sizes} to be a "
                    f"multiple of micro_batch_size={self.micro_batch_size}, so π_old is scored in "
                    "the same micro-batches as the update"
                )
        if self.old_logp_cache is None:
            return
        if len(minis) == 1:
            self.old_logp_cache.follow_policy(collected)
        else:
            self.capture_old_logp(collected)

    def capture_old_logp(self, collected: TrajectoryBatch) -> None:
        """Freeze π_old for a whole collected batch; call once before its first :meth:`step`."""
        cache = self.old_logp_cache
        if cache is None:
            raise ValueError("the objective declares no old_logp_cache; there is no π_old")
        collected = collected.to(self.device)
        # Sharded: every rank runs as many (collective) forwards as the busiest one; the count
        # is agreed before the first forward, so the collectives pair up in order.
        ghosts = self._ghost_count(len(collected)) if self.sharded else 0
        with self.forward_context():
            cache.capture(self.forward_model, collected, chunk_size=self.micro_batch_size)
            for _ in range(ghosts):
                with torch.no_grad():
                    cache.score(self.forward_model, ghost_rows([], collected[0:1]))  # a row
        if self.certified_deterministic_forward and len(collected):
            self._verify_deterministic(collected[0 : min(self.micro_batch_size, len(collected))])

    @torch.no_grad()
    def score_chunks(
        self,
        batch: TrajectoryBatch,
        rows: int,
        score: Callable[[TrajectoryBatch], Any],
        context: Callable[[], contextlib.AbstractContextManager] | None = None,
    ) -> list:
        """``score`` of each chunk of ``rows`` rows of ``batch``: eval mode, on this trainer's
        device, in ``context`` (default :meth:`forward_context`, the update's precision). A
        sharded rank runs ghost chunks (scored, dropped) so that every rank runs as many
        collective forwards as the busiest."""
        chunks = [batch[s : min(s + rows, len(batch))] for s in range(0, len(batch), rows)]
        passes = [(c, True) for c in chunks]
        ghosts = lockstep_ghosts(len(chunks)) if self.sharded else 0  # every rank agrees first
        passes += [(ghost_rows(chunks), False)] * ghosts if ghosts else []
        out = []
        was_training = self.model.training
        self.model.eval()
        try:
            for chunk, real in passes:
                with (context or self.forward_context)():
                    got = score(chunk.to(self.device))
                if real:
                    out.append(got)
        finally:
            self.model.train(was_training)
        return out

    def held_out_sums(
        self,
        batch: TrajectoryBatch,
        rows: int,
        score: Callable[[TrajectoryBatch], dict[str, float]],
        names: Sequence[str],
        context: Callable[[], contextlib.AbstractContextManager] | None = None,
    ) -> dict[str, float]:
        """``score``'s sums (``names``) over ``batch`` (:meth:`score_chunks`), summed over the
        policy ranks: each rank scores its own share of the held-out rows and the sums make
        every rank's result the whole set's."""
        got = self.score_chunks(batch, rows, score, context)
        local = [sum(g[k] for g in got) for k in names]
        return dict(zip(names, dp.all_reduce_floats(local), strict=True))

    def _ghost_count(self, rows: int) -> int:
        return lockstep_ghosts(-(-rows // self.micro_batch_size))

    @torch.no_grad()
    def _verify_deterministic(self, chunk: TrajectoryBatch) -> None:
        cache = self.old_logp_cache
        with self.forward_context():
            again = cache.score(self.forward_model, chunk)
        frozen = cache.old_logprobs(chunk, again)
        mask = chunk.response_mask
        if not torch.equal(again[mask], frozen[mask]):
            diff = (again[mask] - frozen[mask]).abs().max().item()
            raise NondeterministicForwardError(
                "certified_deterministic_forward=True, but scoring the same rows twice gave "
                f"logprobs differing by up to {diff:.3e}; the first update's ratio would not be 1. "
                "Use deterministic kernels or set certified_deterministic_forward=False"
            )

    def end_collected(self) -> None:
        super().end_collected()
        heap.trim()
        if self.old_logp_cache is not None:
            self.old_logp_cache.clear()

    def before_update(self, batch: TrajectoryBatch) -> None:
        if self.old_logp_cache is None:
            return
        try:
            self.old_logp_cache.attest(batch)
        except PiOldError as e:
            raise PiOldNotCapturedError(str(e)) from None

    def batch_metrics(self, batch: TrajectoryBatch) -> dict[str, float]:
        real, forwarded = padding_counts(batch, self.micro_slices(batch))
        tokens, real, forwarded = dp.all_reduce_floats(
            [int(batch.attention_mask.sum()), real, forwarded]
        )
        # The share of the columns the update's (trimmed) micro-batch forwards ran on that
        # were padding: what rl.micro_batch_tokens exists to keep small.
        padding = 1.0 - real / forwarded if forwarded else 0.0
        return {"train/tokens": int(tokens), "train/padding_fraction": padding}

    @property
    def metric_reductions(self) -> dict[str, MetricReduce]:
        return {
            **super().metric_reductions,
            "train/tokens": "sum",
            "train/padding_fraction": "mean",
        }
