"""Objective conformance kit: check any objective against the contract the trainer relies on.

Run it in a test on a tiny model and a small batch::

    from posttrain.testing import check_objective, synthetic_batch
    batch = synthetic_batch(vocab_size=64, batch_size=6, seed=0, dtype=torch.float64)
    report = check_objective(my_objective, lambda: tiny_model().double(), batch)

It raises :class:`ConformanceError` listing every failed check, or returns a
:class:`ConformanceReport`. The checks: the identity is present and serialisable; an objective
that declares an ``old_logp_cache`` really consults it; the loss is a finite scalar on the graph;
every metric is mapped or ignored by the adapter; for TOKEN_SUM the weight is reported, positive
and additive over chunks, the numerators add up, and the gradient accumulated by the trainer over
k chunks equals the whole-batch gradient; for MEAN the same gradient equality over k equal-sized
chunks (the documented MEAN behaviour). Use float64 models so the comparison can be tight; ``rtol``/``atol`` bound
each parameter's gradient error norm relative to its gradient norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from posttrain.algorithm.primitives.objective import (
    OBJECTIVE_WEIGHT_SUM,
    Objective,
    ObjectiveContractError,
    Reduction,
)
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.trainer import distributed as dp
from posttrain.trainer.accumulate import accumulate_gradients, split_evenly

#: (rtol, atol) on each gradient tensor's norm. Not tighter for float64 because many Hugging Face
#: models compute norms in float32 internally; a reduction bug shows as an O(1) relative error.
_TOLERANCES = {torch.float64: (1e-6, 1e-12), torch.float32: (1e-4, 1e-7)}


class ConformanceError(AssertionError):
    """An objective failed one or more contract checks; ``failures`` lists them."""

    def __init__(self, failures: Sequence[str]) -> None:
        self.failures = list(failures)
        super().__init__(
            "objective does not conform:\n" + "\n".join(f"  - {f}" for f in self.failures)
        )


@dataclass(frozen=True)
class ConformanceReport:
    reduction: Reduction
    splits: tuple[int, ...]
    max_grad_error: float
    checks: tuple[str, ...]


def check_objective(
    objective: Objective,
    model: nn.Module | Callable[[], nn.Module],
    batch: TrajectoryBatch,
    *,
    splits: Sequence[int] = (2, 3),
    rtol: float | None = None,
    atol: float | None = None,
) -> ConformanceReport:
    """Check ``objective`` on ``batch`` with ``model`` (a module or a zero-argument factory)."""
    if dp.is_distributed():
        raise ValueError(
            "run check_objective in a single process (torch.distributed is initialised)"
        )
    if not isinstance(objective, Objective):
        raise ConformanceError([f"not an Objective: {type(objective).__name__}"])
    module = model if isinstance(model, nn.Module) else model()
    was_training = module.training
    module.eval()  # no dropout: the comparison must be deterministic
    try:
        return _Checker(objective, module, batch, rtol, atol).run(splits)
    finally:
        module.zero_grad(set_to_none=True)
        module.train(was_training)
        if objective.old_logp_cache is not None:
            objective.old_logp_cache.clear()


class _Checker:
    def __init__(self, objective, model, batch, rtol, atol) -> None:
        self.objective, self.model = objective, model
        self.batch = batch.to(next(model.parameters()).device)
        dtype = next(model.parameters()).dtype
        default = _TOLERANCES.get(dtype, (1e-2, 1e-3))
        self.rtol = default[0] if rtol is None else rtol
        self.atol = default[1] if atol is None else atol
        self.failures: list[str] = []
        self.passed: list[str] = []

    def _record(self, name: str, failure: str | None) -> None:
        (self.failures.append(f"{name}: {failure}") if failure else self.passed.append(name))

    def run(self, splits: Sequence[int]) -> ConformanceReport:
        obj = self.objective
        self._record(
            "identity",
            None
            if obj.identity
            else "identity is empty; record what "
            "defines the algorithm (name, loss type, coefficients) for provenance",
        )
        if obj.old_logp_cache is not None:
            self._check_consults_pi_old()
            obj.old_logp_cache.capture(self.model, self.batch)
        loss, metrics, grads = self._whole()
        if loss is None:
            raise ConformanceError(self.failures)
        self._check_metrics(metrics)
        if obj.reduction is Reduction.TOKEN_SUM:
            ks = [k for k in splits if 2 <= k <= len(self.batch)]
        else:
            ks = [k for k in splits if 2 <= k <= len(self.batch) and len(self.batch) % k == 0]
        if not ks:
            raise ValueError(
                f"no usable split in {list(splits)} for a batch of {len(self.batch)} rows "
                "(need 2 <= k <= rows, and k dividing rows for MEAN objectives)"
            )
        worst = 0.0
        for k in ks:
            worst = max(worst, self._check_split(k, loss, metrics, grads))
        if self.failures:
            raise ConformanceError(self.failures)
        return ConformanceReport(obj.reduction, tuple(ks), worst, tuple(self.passed))

    def _check_consults_pi_old(self) -> None:
        self.objective.old_logp_cache.clear()
        try:
            with torch.no_grad():
                self.objective(self.model, self.batch)
        except ObjectiveContractError:
            self._record("consults_pi_old", None)
            return
        self._record(
            "consults_pi_old",
            "declares old_logp_cache but ran without π_old captured; an objective must read "
            "π_old through cache.old_logprobs(batch, logp) or not declare a cache",
        )

    def _whole(self):
        self.model.zero_grad(set_to_none=True)
        try:
            loss, metrics = self.objective(self.model, self.batch)
        except ObjectiveContractError as e:
            self._record("call", str(e))
            return None, None, None
        if not math.isfinite(float(loss.detach())):
            self._record("finite_loss", f"whole-batch loss is {float(loss.detach())}")
            return None, None, None
        if not loss.requires_grad:
            self._record("on_graph", "loss does not require grad: it is not on the model graph")
            return None, None, None
        loss.backward()
        grads = _grads(self.model)
        self.model.zero_grad(set_to_none=True)
        self.passed.extend(["call", "finite_loss", "on_graph"])
        return float(loss.detach()), metrics, grads

    def _check_metrics(self, metrics) -> None:
        try:
            for split in ("train", "val"):
                self.objective.metric_adapter.adapt(metrics, split)
            self._record("metrics_mapped", None)
        except ObjectiveContractError as e:
            self._record("metrics_mapped", str(e))
        if self.objective.reduction is Reduction.TOKEN_SUM:
            w = float(metrics[OBJECTIVE_WEIGHT_SUM])
            self._record(
                "weight_positive",
                None
                if w > 0
                else (
                    f"{OBJECTIVE_WEIGHT_SUM}={w} on the whole batch; give a batch whose loss has terms"
                ),
            )

    def _check_split(self, k: int, loss: float, metrics, grads) -> float:
        chunks = [self.batch[s] for s in split_evenly(len(self.batch), k)]
        if self.objective.reduction is Reduction.TOKEN_SUM:
            self._check_additive(k, chunks, loss, float(metrics[OBJECTIVE_WEIGHT_SUM]))
        self.model.zero_grad(set_to_none=True)
        acc = accumulate_gradients(self.model, self.objective, chunks)
        split = _grads(self.model)
        self.model.zero_grad(set_to_none=True)
        if not _close(acc.loss, loss, self.rtol, self.atol):
            self._record(f"split_loss[k={k}]", f"accumulated loss {acc.loss!r} != whole {loss!r}")
        worst = 0.0
        for name, g in grads.items():
            err_norm = float((split[name] - g).norm())
            rel = err_norm / max(float(g.norm()), 1e-300)
            worst = max(worst, rel)
            if err_norm > self.atol + self.rtol * float(g.norm()):
                self._record(
                    f"split_gradient[k={k}]",
                    f"gradient of {name} over {k} chunks differs from the whole batch by "
                    f"{rel:.3e} (relative norm); "
                    + (
                        "the loss and its weight use different units (mean-of-means)"
                        if self.objective.reduction is Reduction.TOKEN_SUM
                        else "a MEAN loss must be a per-sample mean; use TOKEN_SUM for token means"
                    ),
                )
                return worst
        self._record(f"split_gradient[k={k}]", None)
        return worst

    @torch.no_grad()
    def _check_additive(self, k: int, chunks, loss: float, weight: float) -> None:
        weights, numerators = [], []
        for chunk in chunks:
            c_loss, c_metrics = self.objective(self.model, chunk)
            w = float(c_metrics[OBJECTIVE_WEIGHT_SUM])
            weights.append(w)
            numerators.append(float(c_loss) * w if w > 0 else 0.0)
        self._record(
            f"weight_additive[k={k}]",
            None
            if _close(sum(weights), weight, self.rtol, self.atol)
            else f"chunk weights {weights} sum to {sum(weights)}, whole batch reports {weight}; "
            "the weight must count units (tokens, sequences), not average them",
        )
        self._record(
            f"numerator_additive[k={k}]",
            None
            if _close(sum(numerators), loss * weight, self.rtol, self.atol)
            else f"chunk numerators sum to {sum(numerators)!r}, whole batch has {loss * weight!r}",
        )


def _grads(model: nn.Module) -> dict[str, Tensor]:
    return {
        n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
        for n, p in model.named_parameters()
        if p.requires_grad
    }


def _close(a: float, b: float, rtol: float, atol: float) -> bool:
    return abs(a - b) <= atol + rtol * abs(b)


def synthetic_batch(
    vocab_size: int,
    batch_size: int,
    *,
    prompt_width: int = 5,
    response_width: int = 6,
    group_size: int = 2,
    seed: int = 0,
    sample_id_offset: int = 0,
    dtype: torch.dtype = torch.float32,
) -> TrajectoryBatch:
    """A random, correctly padded batch with unequal prompt and response lengths.

    Prompts are left-padded, responses right-padded (pad id 0, never sampled as a token);
    every response has at least one loss token. Carries per-response ``advantages`` and
    ``rewards`` and random ``rollout_logprobs`` in ``dtype``.
    """
    if vocab_size < 3:
        raise ValueError(f"vocab_size must be >= 3, got {vocab_size}")
    g = torch.Generator().manual_seed(seed)
    b, p, r = batch_size, prompt_width, response_width
    tokens = torch.randint(1, vocab_size, (b, p + r), generator=g)
    prompt_len = torch.randint(1, p + 1, (b,), generator=g)
    resp_len = torch.randint(1, r + 1, (b,), generator=g)
    pos = torch.arange(p + r)
    prompt_on = (pos[:p] >= p - prompt_len[:, None]) if p else torch.zeros(b, 0, dtype=torch.bool)
    response_mask = pos[:r] < resp_len[:, None]
    attention = torch.cat([prompt_on, response_mask], dim=1)
    input_ids = torch.where(attention, tokens, torch.zeros_like(tokens))
    rewards = torch.rand(b, generator=g, dtype=torch.float64).to(dtype)
    advantages = torch.randn(b, generator=g, dtype=torch.float64).to(dtype)
    rollout_logprobs = (-torch.rand(b, r, generator=g, dtype=torch.float64) * 3).to(dtype)
    return TrajectoryBatch(
        input_ids=input_ids,
        attention_mask=attention.long(),
        response_mask=response_mask,
        group_ids=torch.arange(b, dtype=torch.int64) // group_size,
        sample_ids=torch.arange(b, dtype=torch.int64) + sample_id_offset,
        advantages=advantages,
        rewards=rewards,
        rollout_logprobs=rollout_logprobs * response_mask,
    )


#: Record keys that describe how a run was placed, not what it computed: timings, rates and
#: what a weight sync moved (nothing moves in-process when the rollout shares the policy).
PLACEMENT_FACTS = ("time/", "perf/", "sync/")


def run_numbers(rows: Sequence[dict]) -> list[dict]:
    """A run's metric records without its placement facts: what two placements of one run
    must agree on bit for bit."""
    return [
        {k: v for k, v in r.items() if not k.startswith(PLACEMENT_FACTS) and "per_s" not in k
         and not k.endswith("_s")}
        for r in rows
    ]  # fmt: skip
