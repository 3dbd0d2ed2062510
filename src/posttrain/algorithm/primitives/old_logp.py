"""Where π_old comes from: the one place an objective reads the behaviour policy's log-probs.

An importance ratio ``π_θ / π_old`` needs the log-probs of the policy that produced the collected
batch, frozen across every update taken from it. The trainer decides *when* (once per collected
batch, before the first update); this cache decides *what* an objective sees:

- **frozen** (``capture``): the batch is scored once, under no-grad, and the rows are stored by
  ``sample_id``. Used when a collected batch feeds several optimizer steps.
- **on-policy** (``follow_policy``): the batch feeds exactly one optimizer step, so every row is
  updated by the very parameters that would have scored it: π_old *is* the current forward,
  detached. The ratio is then exactly 1 with the exact policy gradient, and the separate scoring
  forward is skipped.

Either way the cache remembers which rows (sample id and tokens) it was armed for, and
:meth:`old_logprobs` refuses any other row: a stale capture reused by the next collected batch
would otherwise turn the ratio into nonsense without any error.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from posttrain.algorithm.primitives._checks import ObjectiveContractError
from posttrain.data.logprobs import response_logprobs
from posttrain.data.trajectory import TrajectoryBatch


class PiOldError(ObjectiveContractError):
    """π_old was not armed for these rows (never captured, or captured for other tokens)."""


LogprobScorer = Callable[[nn.Module, TrajectoryBatch], Tensor]


class OldLogpCache:
    """π_old of one collected batch, keyed by ``sample_ids`` and attested by tokens."""

    def __init__(self, temperature: float = 1.0, scorer: LogprobScorer | None = None) -> None:
        self.temperature = temperature
        self._scorer = scorer
        self._tokens: dict[int, Tensor] = {}
        self._frozen: dict[int, Tensor] = {}

    def score(self, model: nn.Module, batch: TrajectoryBatch) -> Tensor:
        if self._scorer is not None:
            return self._scorer(model, batch)
        return response_logprobs(model, batch, self.temperature)

    @torch.no_grad()
    def capture(self, model: nn.Module, batch: TrajectoryBatch, chunk_size: int = 0) -> None:
        """Score ``batch`` with the current (about to be updated) policy and freeze it."""
        self._arm(batch)
        size = chunk_size or len(batch)
        for start in range(0, len(batch), size):
            chunk = batch[start : start + size]
            logp = self.score(model, chunk).detach()
            for sid, row in zip(chunk.sample_ids.tolist(), logp, strict=True):
                self._frozen[sid] = row

    def follow_policy(self, batch: TrajectoryBatch) -> None:
        """Arm for a batch that gets exactly one update: π_old is the current forward, detached."""
        self._arm(batch)

    def _arm(self, batch: TrajectoryBatch) -> None:
        ids = batch.sample_ids.tolist()
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise PiOldError(
                f"collected batch repeats sample_ids {dup[:5]}; π_old is keyed by sample id, "
                "so every row of a collected batch needs a distinct sample_ids value"
            )
        self.clear()
        self._tokens = {sid: row for sid, row in zip(ids, batch.input_ids, strict=True)}

    def clear(self) -> None:
        self._tokens, self._frozen = {}, {}

    @property
    def armed(self) -> bool:
        return bool(self._tokens)

    def attest(self, batch: TrajectoryBatch) -> None:
        """Raise unless every row of ``batch`` is one the cache was armed for, token for token."""
        ids = batch.sample_ids.tolist()
        missing = [i for i in ids if i not in self._tokens]
        if missing:
            raise PiOldError(
                f"π_old was not captured for sample_ids {missing[:5]} before this update; the "
                "trainer arms it once per collected batch (train_on_batch, or "
                "capture_old_logp(collected) before the first step())"
            )
        armed = [self._tokens[i] for i in ids]
        # One comparison (one device sync) for the batch; the per-row pass only names the culprits.
        same_shape = all(t.shape == armed[0].shape for t in armed)
        if same_shape and torch.equal(
            torch.stack(armed).to(batch.input_ids.device), batch.input_ids
        ):
            return
        stale = [
            i
            for i, row in zip(ids, batch.input_ids, strict=True)
            if not torch.equal(self._tokens[i].to(row.device), row)
        ]
        if stale:
            raise PiOldError(
                f"π_old for sample_ids {stale[:5]} was captured for different tokens than this "
                "update's rows: the capture is stale; capture again for the new collected batch"
            )

    def old_logprobs(self, batch: TrajectoryBatch, current: Tensor) -> Tensor:
        """π_old's per-token log-probs for ``batch``, given the current policy's ``current``."""
        self.attest(batch)
        if not self._frozen:
            return current.detach()
        rows = torch.stack([self._frozen[i] for i in batch.sample_ids.tolist()])
        return rows.to(current.device)
