"""Trainer: placement, optimizer, precision and exact accumulation for one model and objective.

The trainer owns everything around the loss and nothing inside it: the objective computes
``(loss, metrics)`` for a chunk of rows; the trainer decides how chunks and ranks combine
(``accumulate.py``) and what an optimizer step is. It knows nothing about language models: a
batch is anything with ``len()``, row slicing and ``.to(device)``. What is LLM-specific (π_old,
token counts) is the thin layer in ``llm.py``; the diffusion objective runs on this core as is.

Usage::

    trainer = Trainer(model, objective, lr=1e-4, micro_batch_size=4)
    metrics = trainer.train_on_batch(collected, mini_batches=2)  # one dict per optimizer step
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, Self

import torch
from torch import nn

from posttrain.algorithm.primitives._checks import NonFiniteInputError
from posttrain.algorithm.primitives.objective import (
    MetricReduce,
    Objective,
    ObjectiveContractError,
    Reduction,
)
from posttrain.model.checkpointing import enable_gradient_checkpointing
from posttrain.trainer import distributed as dp
from posttrain.trainer import sharding as sh
from posttrain.trainer.accumulate import (
    Accumulation,
    accumulate_gradients,
    merge_steps,
    row_chunks,
    split_evenly,
)
from posttrain.trainer.errors import NonFiniteTrainingError, ResumeError
from posttrain.trainer.frozen_casts import FrozenCasts, bf16_region
from posttrain.trainer.optim import build_optimizer, build_scheduler

PRECISIONS = ("float32", "bfloat16")

#: The trainer's own metrics and how each combines over the optimizer steps of one collected
#: batch (values are already global over ranks: counts are all-reduced, the rest is global).
TRAINER_METRICS: dict[str, MetricReduce] = {
    "train/optimizer_steps": "last",
    "train/loss": "mean",
    "train/grad_norm": "mean",
    "train/lr": "last",
    "train/micro_batches": "sum",
    "train/samples": "sum",
    "train/skipped_nonfinite": "sum",
    "train/skipped_nonfinite_total": "last",
    "train/skipped_empty": "sum",
    "train/objective_weight": "sum",
}


class Batch(Protocol):
    """What the trainer needs of a batch: its rows, row slices and a device move."""

    def __len__(self) -> int: ...
    def __getitem__(self, idx: slice) -> Self: ...
    def to(self, device: torch.device | str) -> Self: ...


class Trainer:
    """Trains one model with one :class:`Objective`.

    ``precision="float32"`` computes in the parameters' own dtype (no autocast; tests use
    float64 models); ``"bfloat16"`` runs forwards under bf16 autocast with full-precision master
    weights. ``auxiliary_models`` (e.g. the frozen reference behind a ``ReferenceScorer``) are
    moved to the trainer's device (sharded like the policy when it is), put in eval mode and
    frozen; they are never optimised.
    ``max_consecutive_nonfinite`` consecutive skipped steps stop the run. ``compile`` runs the
    objective (forward and log-prob of each micro-batch) through ``torch.compile``.

    Data parallel: when ``torch.distributed`` is initialised, every rank constructs the trainer
    and calls ``train_on_batch``/``step`` together on its own shard (rows and tokens may differ);
    rank 0's weights are broadcast at construction and gradients are all-reduced once per step.
    ``sharding="fsdp"`` shards parameters, gradients and optimizer state over the ranks instead
    (``sharding.py``: FSDP2, reduce-scatter as a sum, ranks kept in lockstep).
    """

    def __init__(
        self,
        model: nn.Module,
        objective: Objective,
        *,
        lr: float,
        micro_batch_size: int,
        optimizer: str = "adamw",
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        grad_clip: float = 0.0,
        lr_schedule: str = "constant",
        warmup_steps: int = 0,
        total_steps: int | None = None,
        precision: str = "float32",
        gradient_checkpointing: bool = False,
        max_consecutive_nonfinite: int = 3,
        auxiliary_models: Sequence[nn.Module] = (),
        device: torch.device | str | None = None,
        compile: bool = False,
        sharding: str = "none",
    ) -> None:
        if not isinstance(objective, Objective):
            raise TypeError(
                f"objective must be a posttrain Objective, got {type(objective).__name__}"
            )
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if sharding not in sh.POLICY_SHARDINGS:
            raise ValueError(f"sharding must be one of {sh.POLICY_SHARDINGS}, got {sharding!r}")
        if grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0 (0 disables clipping), got {grad_clip}")
        if max_consecutive_nonfinite < 1:
            raise ValueError(
                f"max_consecutive_nonfinite must be >= 1, got {max_consecutive_nonfinite}"
            )
        self.sharded = sharding == "fsdp"
        skeleton = sh.on_meta(model)  # a sharded rank > 0: its shards come from rank 0
        if skeleton and not self.sharded:
            raise ValueError("a model on the meta device needs sharding='fsdp' (rank 0 fills it)")
        if device is None:
            device = dp.collective_device() if skeleton else _module_device(model)
        self.device = torch.device(device)
        self.model = model if skeleton else model.to(self.device)
        self.model.train()
        self.objective = objective
        self.micro_batch_size = micro_batch_size
        self.grad_clip = grad_clip
        self.precision = precision
        self.max_consecutive_nonfinite = max_consecutive_nonfinite
        self.auxiliary_models = tuple(auxiliary_models)
        sh.place_frozen(self.auxiliary_models, self.model, self.device, self.sharded, precision)
        if gradient_checkpointing:
            enable_gradient_checkpointing(model)
        if self.sharded:
            sh.shard_model(self.model, precision)  # every rank starts from rank 0's weights
        else:
            dp.broadcast_module_(self.model)
        # The objective's forward + log-prob runs through the compiled wrapper (same parameters);
        # π_old is scored through it too, so a frozen π_old matches the update's forward.
        self.forward_model = torch.compile(self.model, dynamic=True) if compile else self.model
        # Not under gradient checkpointing: its recomputed forwards cast anyway (frozen_casts).
        self._frozen_casts = None if gradient_checkpointing else FrozenCasts(self.model)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the policy model has no parameters with requires_grad=True")
        self.optimizer = build_optimizer(self.params, optimizer, lr, weight_decay, betas, eps)
        self.scheduler = build_scheduler(self.optimizer, lr_schedule, warmup_steps, total_steps)
        self.global_step = 0
        self.consecutive_nonfinite = 0
        self.skipped_nonfinite_total = 0
        self.skipped_empty_total = 0
        self._warned_unequal_mean = False
        #: Name -> component (``state_dict``/``load_state_dict``) whose state rides in trainer.pt.
        self.extra_state: dict[str, Any] = {}

    # -- placement -------------------------------------------------------------------------
    def forward_context(self) -> contextlib.AbstractContextManager:
        """The autocast region every objective forward (and the π_old capture) runs in (none
        when sharded: FSDP's mixed-precision policy casts the gathered parameters itself)."""
        if self.precision == "bfloat16" and not self.sharded:
            return bf16_region(self.device.type, self._frozen_casts)
        return contextlib.nullcontext()

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # -- training --------------------------------------------------------------------------
    def train_on_batch(self, collected: Batch, mini_batches: int = 1) -> list[dict]:
        """One optimizer step per mini-batch of ``collected``; one metrics dict per step.

        Mini-batches are contiguous, near-equal row ranges of ``collected`` (shuffle before
        calling if you want them random).
        """
        if mini_batches < 1:
            raise ValueError(f"mini_batches must be >= 1, got {mini_batches}")
        # One collective so every rank agrees (and fails together) on the step count and rows.
        hi, neg_lo, neg_rows = dp.all_reduce_floats(
            [mini_batches, -mini_batches, -len(collected)], "max"
        )
        if hi != -neg_lo:
            raise ValueError(
                f"mini_batches differs across ranks ({int(-neg_lo)}..{int(hi)}); every rank must "
                "take the same number of optimizer steps per collected batch"
            )
        if -neg_rows < mini_batches:
            raise ValueError(
                f"a collected batch has {int(-neg_rows)} rows (on this or another rank), fewer "
                f"than mini_batches={mini_batches}"
            )
        collected = collected.to(self.device)
        minis = [collected[s] for s in split_evenly(len(collected), mini_batches)]
        self.begin_collected(collected, minis)
        try:
            return [self.step(mb) for mb in minis]
        finally:
            self.end_collected()

    # Hooks of a layer on top (llm.py): a collected batch begins and ends, an update is about
    # to run on a batch, and what a batch adds to the step's metrics.
    def begin_collected(self, collected: Batch, minis: Sequence[Batch]) -> None:
        """Called once per collected batch, before its first update."""

    def end_collected(self) -> None:
        """Called once per collected batch, after its last update (also on failure)."""
        if self._frozen_casts is not None:  # not held through the rollout
            self._frozen_casts.clear()

    def before_update(self, batch: Batch) -> None:
        """Called before any forward of an update; raise to refuse it."""

    def micro_slices(self, batch: Batch) -> list[slice] | list[list[int]]:
        """The rows of each micro-batch of an update (a layer on top may keep groups whole)."""
        return row_chunks(len(batch), self.micro_batch_size)

    def batch_metrics(self, batch: Batch) -> dict[str, float]:
        """Metrics of an update's batch beyond the trainer's own (global over ranks)."""
        return {}

    @property
    def metric_reductions(self) -> dict[str, MetricReduce]:
        """Public metric name -> how it combines over the optimizer steps of a collected batch."""
        return {**TRAINER_METRICS, **self.objective.metric_adapter.public_reductions("train")}

    def merge(self, rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
        """The record of a collected batch from its optimizer steps' records."""
        return merge_steps(rows, self.metric_reductions)

    def step(self, batch: Batch) -> dict[str, Any]:
        """One optimizer step over ``batch`` split into micro-batches; returns public metrics."""
        self.before_update(batch)
        batch = batch.to(self.device)
        self.optimizer.zero_grad(set_to_none=True)
        chunks = [batch[s] for s in self.micro_slices(batch)]
        if self.objective.reduction is Reduction.MEAN and len({len(c) for c in chunks}) > 1:
            self._warn_unequal_mean_chunks([len(c) for c in chunks])
        try:
            acc = accumulate_gradients(
                self.forward_model, self.objective, chunks, forward_context=self.forward_context,
                lockstep=self.sharded,
            )  # fmt: skip
        except NonFiniteInputError:
            # NaN/inf log-probs (a diverged policy) take the path of a NaN loss: skip and count.
            acc = Accumulation(math.nan, math.nan, len(chunks))
        public = self.objective.metric_adapter.adapt(acc.metrics, "train")
        grad_norm = self._clip_and_norm()
        lr = self.lr
        nonfinite = not (math.isfinite(acc.loss) and math.isfinite(grad_norm))
        if nonfinite:
            self._skip_nonfinite(acc.loss, grad_norm)
        elif acc.empty:
            self.optimizer.zero_grad(set_to_none=True)
            self.skipped_empty_total += 1
            warnings.warn(
                f"optimizer step {self.global_step + 1}: the objective weight is 0 on every rank (no response "
                "token carries loss); update skipped",
                stacklevel=2,
            )
        else:
            self.optimizer.step()
            self.scheduler.step()
            self.consecutive_nonfinite = 0
        step = self.global_step
        self.global_step += 1
        metrics = self._step_metrics(step, acc, grad_norm, lr, nonfinite, batch)
        clash = sorted(set(public) & set(metrics))
        if clash:
            raise ObjectiveContractError(
                f"the objective's MetricAdapter maps onto trainer metric names {clash}; "
                "map those objective metrics to other public names"
            )
        metrics.update(public)
        if self.consecutive_nonfinite >= self.max_consecutive_nonfinite:
            raise NonFiniteTrainingError(
                f"stopping at optimizer step {step + 1} (train/optimizer_steps in the metrics): "
                f"{self.consecutive_nonfinite} consecutive optimizer "
                "steps had a non-finite loss or gradient (each was skipped, so the model and "
                "optimizer are still those of the last good step); lower the learning rate, "
                "set grad_clip, or inspect the data of these steps"
            )
        return metrics

    def _warn_unequal_mean_chunks(self, sizes: list[int]) -> None:
        if not self._warned_unequal_mean:
            self._warned_unequal_mean = True
            warnings.warn(
                f"MEAN objective with unequal micro-batches {sizes}: each chunk's mean gets "
                "weight 1/num_chunks, so the step is not the whole-batch mean; make the batch "
                "size a multiple of micro_batch_size or use a TOKEN_SUM objective",
                stacklevel=3,
            )

    def _clip_and_norm(self) -> float:
        if self.sharded:
            return sh.grad_norm_(self.params, self.grad_clip)
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm(grads)
        return float(norm)

    def _skip_nonfinite(self, loss: float, grad_norm: float) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.consecutive_nonfinite += 1
        self.skipped_nonfinite_total += 1
        warnings.warn(
            f"optimizer step {self.global_step + 1}: non-finite loss ({loss}) or gradient norm "
            f"({grad_norm}); "
            f"update skipped ({self.consecutive_nonfinite}/{self.max_consecutive_nonfinite} "
            "consecutive before the run stops)",
            stacklevel=3,
        )

    def _step_metrics(self, step, acc, grad_norm, lr, nonfinite, batch) -> dict:
        rows, chunks = dp.all_reduce_floats([len(batch), acc.num_chunks])
        out: dict[str, Any] = {
            "train/optimizer_steps": self.global_step,
            "train/loss": acc.loss,
            "train/grad_norm": grad_norm,
            "train/lr": lr,
            "train/micro_batches": int(chunks),
            "train/samples": int(rows),
            "train/skipped_nonfinite": int(nonfinite),
            "train/skipped_nonfinite_total": self.skipped_nonfinite_total,
            "train/skipped_empty": int(acc.empty and not nonfinite),
        }
        if self.objective.reduction is Reduction.TOKEN_SUM:
            out["train/objective_weight"] = acc.weight
        out.update(self.batch_metrics(batch))
        return out

    # -- state -----------------------------------------------------------------------------
    def state_dict(self, optimizer: bool = True) -> dict[str, Any]:
        """Optimizer, scheduler and counters (model weights are saved separately, HF layout);
        ``optimizer=False`` leaves the optimizer out (a sharded checkpoint keeps it in DCP)."""
        out = {"optimizer": self.optimizer.state_dict()} if optimizer else {}
        if self.extra_state:
            out["extra"] = {k: v.state_dict() for k, v in self.extra_state.items()}
        return out | {
            "scheduler": self.scheduler.state_dict(),
            "global_step": self.global_step,
            "consecutive_nonfinite": self.consecutive_nonfinite,
            "skipped_nonfinite_total": self.skipped_nonfinite_total,
            "skipped_empty_total": self.skipped_empty_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the optimizer only when ``state`` holds it."""
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.global_step = int(state["global_step"])
        self.consecutive_nonfinite = int(state["consecutive_nonfinite"])
        self.skipped_nonfinite_total = int(state["skipped_nonfinite_total"])
        self.skipped_empty_total = int(state["skipped_empty_total"])
        extra = state.get("extra", {})
        for name, component in self.extra_state.items():
            if name not in extra:
                raise ResumeError(
                    f"the checkpoint holds no {name} state (written by a run without it); "
                    "resume with the config that wrote it, or start a new job.name"
                )
            component.load_state_dict(extra[name])


def _module_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")
