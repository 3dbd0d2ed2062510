"""The fixed-lag schedule of ``rl.off_policy_lag`` and the batches it holds in flight.

With lag ``k`` the batch trained at step ``s`` is sampled with the weights after step
:func:`sampled_with` ``(s, k) = max(s - 1 - k, 0)`` (0: the initial weights). Step ``s`` runs::

    submit collect(s + k)      [data side, one background thread: rollout, declared roles
                                (the OPD teacher, the KL reference: placement/reference.py),
                                reward]
    train(batch s)             [policy ranks, meanwhile]
    wait for collect(s + k)    -> in flight: batches s+1 .. s+k
    sync weights after step s  -> the rollout samples batch s+1+k with them at step s+1

so which weights sampled which batch is a function of the step alone, never of which side
finishes first. The first ``k`` batches are collected before step 1 with the initial weights. A
checkpoint after step ``s`` holds batches ``s+1 .. s+k`` (:meth:`Pipeline.state`): the weights that
sampled them are gone, so a resumed run trains on the very batches the killed one would have.
Each batch carries the weights version that sampled it; ``train/offpolicy/staleness`` is how many
updates the trainer's weights are ahead of it.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from posttrain.config import ConfigError
from posttrain.data.trajectory import TrajectoryBatch


def sampled_with(step: int, lag: int) -> int:
    """Policy steps behind the weights that sample step ``step``'s batch (0: the initial ones)."""
    return max(step - 1 - lag, 0)


@dataclass
class Collected:
    """One step's batch as the data side hands it over: annotated batch, the data cursor after
    it, the weights version that sampled it, its reward / sampling metrics, phase seconds, the
    response tokens generated, and the sample rows kept for the step (plain values)."""

    step: int
    version: int
    cursor: int
    batch: TrajectoryBatch
    metrics: dict[str, float]
    times: dict[str, float]
    generated_tokens: int
    samples: list[dict]

    def to_state(self) -> dict[str, Any]:
        """Tensors and plain values only (the checkpoint's ``data_state.pt`` loads with
        ``weights_only=True``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        b = self.batch
        fields = {f.name: getattr(b, f.name) for f in dataclasses.fields(b)}
        fields["columns"] = dict(b.columns)
        out["batch"] = {k: v for k, v in fields.items() if v is not None}
        return out

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Collected:
        return cls(**{**state, "batch": TrajectoryBatch(**state["batch"])})


#: collect(cursor, step, version) -> that step's batch, sampled by the rollout's current weights.
Collect = Callable[[int, int, int], Collected]


class Pipeline:
    """Runs the schedule above for ``lag >= 1``; ``collect`` and ``sync`` are the body's."""

    def __init__(self, lag: int, collect: Collect, sync: Callable[[], Any], state=None) -> None:
        if lag < 1:
            raise ValueError(f"a pipeline needs lag >= 1, got {lag}")
        self.lag, self._collect, self._sync = lag, collect, sync
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="posttrain-collect")
        self.queue: deque[Collected] = deque()
        self.cursor, self.version = 0, 0  # data cursor after the last batch; rollout's weights
        if state is not None:
            self._restore(state)

    def _restore(self, state) -> None:
        saved = state.data_state
        if saved.get("off_policy_lag") != self.lag or "in_flight" not in saved:
            raise ConfigError(
                f"{state.path} holds no batches in flight for rl.off_policy_lag={self.lag} (it "
                f"was saved with rl.off_policy_lag={saved.get('off_policy_lag', 0)}); resume it "
                "with that lag, or start a new run under another job.name"
            )
        self.queue.extend(Collected.from_state(c) for c in saved["in_flight"])
        self.cursor, self.version = self.queue[-1].cursor, state.step
        expected = list(range(state.step + 1, state.step + 1 + self.lag))
        if [c.step for c in self.queue] != expected:
            raise ConfigError(
                f"{state.path}: its batches in flight are for steps "
                f"{[c.step for c in self.queue]}, not {expected}; the checkpoint is damaged"
            )

    def prefill(self) -> None:
        """Before step 1: the first ``lag`` batches, sampled with the initial weights."""
        while len(self.queue) < self.lag:
            self._push(self._collect(self.cursor, len(self.queue) + 1, self.version))

    def _push(self, collected: Collected) -> None:
        self.queue.append(collected)
        self.cursor = collected.cursor

    def step(self, step: int, train: Callable[[TrajectoryBatch], dict]) -> tuple[Collected, dict]:
        """Train step ``step``'s batch while step ``step + lag``'s is collected; then sync.
        Returns the trained batch and the policy's metrics with the pipeline's own."""
        if not self.queue:
            self.prefill()
        current = self.queue.popleft()
        ahead = step + self.lag
        if current.step != step or self.version != sampled_with(ahead, self.lag):
            raise RuntimeError(  # the schedule is broken: never train on a wrong batch
                f"pipeline out of order at step {step}: batch of step {current.step}, rollout "
                f"weights after step {self.version}"
            )
        future = self._pool.submit(self._collect, self.cursor, ahead, self.version)
        t0 = time.perf_counter()
        metrics = train(current.batch)  # on error the data thread ends with the actors
        t1 = time.perf_counter()
        self._push(future.result())
        t2 = time.perf_counter()
        self._sync()
        self.version = step
        metrics = {
            **metrics,
            "train/offpolicy/staleness": float(step - 1 - current.version),
            "time/train_s": t1 - t0,
            "time/pipeline_wait_s": t2 - t1,
            "time/sync_s": time.perf_counter() - t2,
        }
        return current, metrics

    def state(self) -> dict[str, Any]:
        """What a checkpoint after the current step records (see the module doc)."""
        return {
            "off_policy_lag": self.lag,
            "in_flight": [c.to_state() for c in self.queue],
        }

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
