"""π_old capture and the attestation that an update is measured against it.

An objective that declares an ``old_logp_cache`` computes importance ratios against the policy
that produced the collected batch. The trainer captures that policy's logprobs once, before the
first update, and remembers exactly which rows (sample id and tokens) it captured. An update for a
row that was not captured this way is refused before any forward runs: otherwise a stale cache
(sample ids reused by the next collected batch) would silently turn the ratio into nonsense.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import Tensor, nn

from posttrain.algorithm.primitives.objective import OldLogpCache
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.trainer.errors import NondeterministicForwardError, PiOldNotCapturedError


class PiOldGuard:
    """Captures π_old into an objective's cache and attests later updates against it."""

    def __init__(self, cache: OldLogpCache | None) -> None:
        self.cache = cache
        self._rows: dict[int, Tensor] = {}

    @property
    def consults_pi_old(self) -> bool:
        return self.cache is not None

    def capture(
        self,
        model: nn.Module,
        batch: TrajectoryBatch,
        chunk_size: int,
        forward_context: Callable[[], contextlib.AbstractContextManager],
        verify_deterministic: bool = False,
    ) -> None:
        """Freeze π_old for every row of ``batch`` (no-grad), scoring ``chunk_size`` rows at a time.

        With ``verify_deterministic`` the first chunk is scored a second time and must match the
        captured rows bit for bit on response tokens, which is what makes the first update's
        ratio exactly 1.
        """
        if self.cache is None:
            raise ValueError(
                "the objective declares no old_logp_cache; there is no π_old to capture"
            )
        ids = batch.sample_ids.tolist()
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(
                f"collected batch repeats sample_ids {dup[:5]}; π_old is keyed by sample id, "
                "so every row of a collected batch needs a distinct sample_ids value"
            )
        self.release()
        with forward_context():
            self.cache.capture(model, batch, chunk_size=chunk_size)
        self._rows = {sid: row for sid, row in zip(ids, batch.input_ids, strict=True)}
        if verify_deterministic and len(batch):
            self._verify(model, batch[0 : min(chunk_size, len(batch))], forward_context)

    @torch.no_grad()
    def _verify(self, model, chunk: TrajectoryBatch, forward_context) -> None:
        with forward_context():
            again = self.cache.score(model, chunk)
        frozen = self.cache.lookup(chunk)
        mask = chunk.response_mask
        if not torch.equal(again[mask], frozen[mask]):
            diff = (again[mask] - frozen[mask]).abs().max().item()
            raise NondeterministicForwardError(
                "certified_deterministic_forward=True, but scoring the same rows twice gave "
                f"logprobs differing by up to {diff:.3e}; the first update's ratio would not be 1. "
                "Use deterministic kernels or set certified_deterministic_forward=False"
            )

    def attest(self, batch: TrajectoryBatch) -> None:
        """Refuse an update on rows whose π_old was not captured (or was captured for other tokens)."""
        if self.cache is None:
            return
        ids = batch.sample_ids.tolist()
        missing = [i for i in ids if i not in self._rows]
        if missing or not self.cache.captured:
            raise PiOldNotCapturedError(
                "the objective consults π_old (it declares old_logp_cache) but π_old was not "
                f"captured for sample_ids {(missing or ids)[:5]} before this update; use "
                "train_on_batch(collected_batch), or call capture_old_logp(collected_batch) "
                "once before the first step() of a collected batch"
            )
        stale = [
            i
            for i, row in zip(ids, batch.input_ids, strict=True)
            if not torch.equal(self._rows[i].to(row.device), row)
        ]
        if stale:
            raise PiOldNotCapturedError(
                f"π_old for sample_ids {stale[:5]} was captured for different tokens than this "
                "update's rows: the capture is stale; capture again for the new collected batch"
            )

    def release(self) -> None:
        """Forget the capture so the next collected batch cannot reuse it."""
        if self.cache is not None:
            self.cache.clear()
        self._rows = {}
