"""One policy rank of FSDP tests: ``python fsdp_worker.py RANK WORLD STORE JOBS_JSON``.

Each job says which model folder to train, ``sharding`` (none / fsdp), how many steps of the
real GRPO objective on synthetic batches (dispatched to ranks as Ray placement does), and
optionally a checkpoint to load before and/or save after (``first_step``: the step a loaded
job goes on from), and ``reset``: a KL reference reset every that many steps (a full
reference, or under ``lora`` the frozen adapters). Rank 0 writes the full (gathered)
parameters and optimizer moments, the reported losses and every rank's shard sizes to
``job["out"]``. The jobs share one gloo group (also with one rank, which FSDP needs).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1] / "src")]

import torch  # noqa: E402

torch.set_num_threads(1)

import torch.distributed as dist  # noqa: E402


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if dist.is_initialized():
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {k: v.clone() for k, v in get_model_state_dict(model, options=opts).items()}
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def full_optimizer(trainer) -> dict[str, torch.Tensor]:
    """The optimizer's moments by parameter name, gathered (``exp_avg`` and ``exp_avg_sq``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=dist.is_initialized())
    state = get_optimizer_state_dict(trainer.model, trainer.optimizer, options=opts).get(
        "state", {}
    )
    return {
        f"{name}/{key}": v.clone()
        for name, s in state.items()
        for key, v in s.items()
        if isinstance(v, torch.Tensor) and v.ndim > 0
    }


def save_on_full_disk(manager, trainer, job: dict, rank: int) -> str:
    """Save step ``save + 1`` while every shard file rank ``full_disk_rank`` opens fails with
    ENOSPC; returns how the save failed on this rank (``type: message``)."""
    import errno
    import os
    from contextlib import contextmanager

    from torch.distributed.checkpoint.filesystem import FileSystem

    real = FileSystem.create_stream

    @contextmanager
    def full(self, path, mode):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        yield  # a context manager, as the one it replaces

    if rank == job["full_disk_rank"]:
        FileSystem.create_stream = full
    try:
        manager.save(job["save"] + 1, trainer, config={"test": True})
    except BaseException as e:  # noqa: BLE001 - the test judges whatever it was
        return f"{type(e).__name__}: {e}"
    finally:
        FileSystem.create_stream = real
    return "saved"


def run_job(job: dict, rank: int, world: int) -> None:
    from posttrain.config.build import build_objective, objective_context
    from posttrain.config.overrides import apply_overrides
    from posttrain.config.schema import PosttrainConfig
    from posttrain.model.loading import load_policy
    from posttrain.model.lora import AdapterFreeReference, apply_lora
    from posttrain.placement.dispatch import shard_batch
    from posttrain.placement.reference_reset import ReferenceReset, ResettableAdapterReference
    from posttrain.testing import synthetic_batch
    from posttrain.trainer import CheckpointManager, LLMTrainer
    from posttrain.trainer.sharding import shard_bytes

    cfg = apply_overrides(PosttrainConfig(), job.get("opts", []))
    model, _ = load_policy(job["model"], None, "float32")
    reference, auxiliary, every = None, (), job.get("reset", 0)  # every: reference resets
    if job.get("lora"):
        model = apply_lora(model, job["lora"], 16.0, ["q_proj", "v_proj"], 0)
        if cfg.rl.kl_beta > 0:
            frozen = ResettableAdapterReference if every else AdapterFreeReference
            reference = frozen(model)
    elif every:  # a full reference, sharded by the trainer like the policy
        reference, _ = load_policy(job["model"], None, "float32")
        auxiliary = (reference,)
    objective = build_objective(cfg.rl, objective_context(cfg, reference))
    minis = cfg.rl.mini_batch_per_replica
    trainer = LLMTrainer(
        model, objective, lr=job.get("lr", 1e-3), micro_batch_size=cfg.rl.micro_batch_size,
        grad_clip=cfg.rl.grad_clip, sharding=job["sharding"], precision=cfg.model.dtype,
        gradient_checkpointing=cfg.model.gradient_checkpointing, auxiliary_models=auxiliary,
    )  # fmt: skip
    reset = None
    if every:
        reset = ReferenceReset(model, reference, trainer.optimizer, every, False)
        trainer.extra_state["reference_reset"] = reset
    manager = CheckpointManager(job.get("ckpt_root", job["out"] + "-ckpt"), keep_last=0)
    if job.get("load"):
        try:
            manager.load(job["load"], trainer, config={"test": True})
        except Exception as e:  # a job that expects the load to be refused records why
            if not job.get("expect_error"):
                raise
            if rank == 0:
                torch.save({"error": f"{type(e).__name__}: {e}"}, job["out"])
            dist.barrier()
            return
    losses = []
    vocab = model.config.vocab_size
    first = job.get("first_step", 0)  # a resumed job goes on with the batches after its load
    for step in range(first, first + job.get("steps", 3)):
        batch = synthetic_batch(vocab, job.get("rows", 8), seed=100 + step, response_width=8)
        mine = shard_batch(batch, world, minis)[rank]
        rows = trainer.train_on_batch(mine, mini_batches=minis)
        losses.append([r["train/loss"] for r in rows])
        if reset is not None:
            reset.after_update({})
    if job.get("save") is not None:
        manager.save(job["save"], trainer, config={"test": True})
    full_disk = None
    if job.get("full_disk_rank") is not None:  # the next save finds that rank's disk full
        full_disk = [None] * world
        dist.all_gather_object(full_disk, save_on_full_disk(manager, trainer, job, rank))
    state = full_state(trainer.model)
    optim = full_optimizer(trainer)
    sizes = shard_bytes(trainer.model, trainer.optimizer)
    all_sizes = [None] * world
    dist.all_gather_object(all_sizes, sizes)
    if rank == 0:
        result = {"params": state, "optim": optim, "losses": losses, "sizes": all_sizes,
                  "full_disk": full_disk}  # fmt: skip
        if job.get("lora") and job["sharding"] == "none":
            from posttrain.model.lora import merged_state

            result["merged"] = {k: v.clone() for k, v in merged_state(trainer.model).items()}
        torch.save(result, job["out"])
    dist.barrier()


if __name__ == "__main__":
    from gloo_worker import serve

    serve(run_job)
