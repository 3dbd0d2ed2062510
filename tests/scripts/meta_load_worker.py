"""One rank of the meta-device loading test: ``python meta_load_worker.py RANK WORLD STORE JSON``.

For each job it builds the policy as a sharded rank does (``skeleton``: rank > 0 builds the
model on the meta device and receives its shards from rank 0; otherwise every rank loads the
full weights, the path before meta loading), optionally wraps it in LoRA, shards it, trains
``steps`` GRPO steps on synthetic batches, and writes this rank's local shards right after
loading and after training, plus its load peak RSS, to ``OUT-rank{r}.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2] / "src")]

import torch  # noqa: E402

torch.set_num_threads(1)

import torch.distributed as dist  # noqa: E402


def shards(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from posttrain.trainer.sharding import local

    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {k: local(v).detach().clone() for k, v in named.items()}


def run_job(job: dict, rank: int, world: int) -> None:
    from posttrain.config import PosttrainConfig, apply_overrides
    from posttrain.config.build import build_objective, objective_context
    from posttrain.model.loading import load_policy
    from posttrain.model.lora import apply_lora
    from posttrain.placement.dispatch import shard_batch
    from posttrain.testing import synthetic_batch
    from posttrain.trainer import LLMTrainer

    cfg = apply_overrides(PosttrainConfig(), ["rl.micro_batch_size=2"])
    skeleton = job["skeleton"] and rank > 0
    model, _ = load_policy(job["model"], None, "float32", skeleton=skeleton)
    if job.get("lora"):
        model = apply_lora(model, job["lora"], 16.0, ["q_proj", "v_proj"], seed=3)
    trainer = LLMTrainer(model, build_objective(cfg.rl, objective_context(cfg)), lr=1e-3,
                         micro_batch_size=2, sharding="fsdp")  # fmt: skip
    loaded = shards(trainer.model)
    for step in range(job.get("steps", 2)):
        batch = synthetic_batch(trainer.model.config.vocab_size, 6, seed=step, response_width=6)
        trainer.train_on_batch(shard_batch(batch, world, 1)[rank])
    torch.save({"loaded": loaded, "trained": shards(trainer.model)}, f"{job['out']}-rank{rank}.pt")
    dist.barrier()


if __name__ == "__main__":
    from gloo_worker import serve

    serve(run_job)
