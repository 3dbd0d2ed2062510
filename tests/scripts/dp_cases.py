"""Cases shared by the two-rank worker and the single-process reference it is compared with."""

from __future__ import annotations

import torch
from trainer_support import LOSS_TYPES, VOCAB, TinyCausalLM, mean_objective, pg_objective

from posttrain.data.trajectory import TrajectoryBatch
from posttrain.testing import synthetic_batch
from posttrain.trainer import LLMTrainer, split_evenly

# name -> (objective kind, loss type, rows, rows on rank 0, micro on ranks, mini-batches, optimizer)
CASES: dict[str, tuple] = {
    **{lt: ("pg", lt, 7, 3, 2, 1, "sgd") for lt in LOSS_TYPES},
    "mean": ("mean", None, 8, 4, 2, 1, "sgd"),
    "pi_old_adamw_two_minis": ("pg_old", "seq-mean-token-mean", 8, 4, 1, 2, "adamw"),
}


def objective_for(name):
    kind, loss_type, *_ = CASES[name]
    if kind == "mean":
        return mean_objective()
    return pg_objective(loss_type, max_response_length=6, use_pi_old=kind == "pg_old")


def full_batch(name) -> TrajectoryBatch:
    return synthetic_batch(VOCAB, CASES[name][2], seed=11, dtype=torch.float64)


def shard(name, batch: TrajectoryBatch, rank: int) -> TrajectoryBatch:
    split = CASES[name][3]
    return batch[0:split] if rank == 0 else batch[split:]


def single_process_batch(name, batch: TrajectoryBatch) -> TrajectoryBatch:
    """Reorder rows so that single-process mini-batch j is the union of the ranks' mini-batch j."""
    minis = CASES[name][5]
    ranks = [
        torch.arange(len(batch))[0 : CASES[name][3]],
        torch.arange(len(batch))[CASES[name][3] :],
    ]
    order = [r[s] for j in range(minis) for r in ranks for s in [split_evenly(len(r), minis)[j]]]
    return batch[torch.cat(order)]


def train(name, model, batch: TrajectoryBatch, micro: int) -> dict:
    *_, minis, optimizer = CASES[name]
    trainer = LLMTrainer(
        model, objective_for(name), lr=0.05, optimizer=optimizer, micro_batch_size=micro
    )
    metrics = trainer.train_on_batch(batch, mini_batches=minis)
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "grads": [p.grad.detach().clone() for p in model.parameters()],
        "losses": [m["train/loss"] for m in metrics],
        "weights": [m.get("train/objective_weight") for m in metrics],
        "metrics": [{k: float(v) for k, v in m.items()} for m in metrics],
        "trainer": trainer,
    }


def reference(name) -> dict:
    """The single-process run on the full batch, split into different micro-batches."""
    batch = single_process_batch(name, full_batch(name))
    micro = 2 if CASES[name][0] == "mean" else 3
    return train(name, TinyCausalLM(seed=0), batch, micro)
