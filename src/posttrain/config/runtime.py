"""Config sections for placement, logging and checkpoints: where and how a run executes."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from posttrain.config.base import Section


class PlacementConfig(Section):
    """Where the roles (rollout, reward, policy, reference, teacher) run."""

    section_name = "placement"

    backend: Literal["local", "ray"] = Field(
        "local",
        description="`local` runs every role in this process on one machine; `ray` places each "
        "role (every policy rank, the rollout, the reward) in its own Ray actor. Both give the "
        "same numbers for the same seed.",
    )
    ray_address: str = Field(
        "",
        description="Ray cluster to join (`auto`, or the `HOST:PORT` printed by `ray start "
        "--head`); empty starts a local Ray instance without the dashboard web UI (Ray still runs "
        "its minimal API server and dashboard agent: runtime environments and metrics need "
        "them). Ignored when this process already runs Ray. Read only for `backend=ray`.",
    )
    policy_ranks: int = Field(
        1,
        ge=1,
        description="Data-parallel policy ranks: one process each, joined in one "
        "torch.distributed group (gloo on CPU, nccl on GPU). More than 1 needs `backend=ray`.",
    )
    policy_sharding: Literal["none", "fsdp"] = Field(
        "none",
        description="`none` replicates the policy on every rank (full weights, gradients and "
        "AdamW state each, gradients all-reduced); `fsdp` shards all three over the policy ranks "
        "with PyTorch FSDP2 (each decoder layer and the root; bf16 compute over float32 shards "
        "when `model.dtype=bfloat16`) and checkpoints through torch.distributed.checkpoint. "
        "Needs `backend=ray` (any `policy_ranks`, 1 included).",
    )
    sync_bucket_mb: float = Field(
        256.0,
        gt=0,
        description="Weight sync to a rollout with its own copy of the weights (every Ray run; "
        "a local run with `rollout.dtype` other than float32) sends them in buckets of at most "
        "this many MiB, one at a time: no policy rank holds more than one bucket beyond its "
        "weights or shards (a tensor larger than a bucket travels alone). With LoRA only the "
        "adapters travel.",
    )
    reference_on: Literal["auto", "policy", "data"] = Field(
        "auto",
        description="Where the frozen KL reference scores each batch (read only when the run has "
        "one: `rl.kl_beta > 0`). `policy`: inside the update, on every policy rank. `data`: a "
        "reference role on the data side scores the collected batch before the update (its own "
        "Ray actor, or in-process under `local`), in the update's own micro-batches, so under "
        "`rl.off_policy_lag` it runs while the policy trains. Memory: without LoRA the frozen copy "
        "moves from every policy rank to the reference role; with LoRA the policy's reference is "
        "free (adapters off) and `data` loads one more float32 copy of the base. `auto`: `data` "
        "when `rl.off_policy_lag >= 1` (Ray), else `policy`.",
    )
    cpus_per_role: float = Field(
        1.0,
        gt=0,
        description="CPUs Ray reserves for each actor (every policy rank, the rollout, the "
        "reward). Read only for `backend=ray`.",
    )
    gpus_per_role: float = Field(
        0.0,
        ge=0,
        description="GPUs Ray reserves for each actor that holds a model (every policy rank and "
        "the rollout; the reward actor takes none); above 0 those roles run on CUDA. Read only "
        "for `backend=ray`.",
    )
    torch_threads_per_process: int = Field(
        1,
        ge=1,
        description="torch intra-op threads of every process that runs roles (each Ray actor, or "
        "the one process of a `local` run); keep the product with the process count at or below "
        "the core count. For small models one thread is fastest.",
    )
    role_call_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="Seconds one role call (a rollout, a reward batch, a policy update, a save) "
        "may take before the run stops with one line naming the role: a hung reward function or "
        "a hung or stopped Ray actor otherwise blocks the driver forever. Under `backend=local` "
        "a watchdog interrupts the driver's main thread (SIGUSR2).",
    )
    device: str = Field(
        "auto",
        pattern=r"^(auto|cpu|cuda|cuda:[0-9]+)$",
        description="Device of the model-bearing roles (policy, reference, rollout, teacher) of a "
        "`local` run: `auto` (CUDA when present, else the CPU), `cpu`, `cuda` or `cuda:N`. Ray "
        "places roles with `gpus_per_role` instead.",
    )

    @field_validator("cpus_per_role", "gpus_per_role", "role_call_timeout_s", "sync_bucket_mb")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be finite")
        return value


class LoggingConfig(Section):
    """Where metrics go. A metrics JSONL file in the run directory is always written."""

    section_name = "logging"

    progress: bool = Field(
        True,
        description="A live progress bar on stderr when it is a terminal; otherwise (false, or "
        "stderr is a file or pipe) a plain line every `logging.log_every` steps.",
    )
    log_every: int = Field(
        10,
        ge=0,
        description="Steps between the plain progress lines printed instead of a progress bar "
        "(the first step a process runs and the last step always get one); 0 prints none.",
    )
    tensorboard: bool = Field(False, description="Also write TensorBoard event files.")
    wandb: bool = Field(False, description="Also log to Weights & Biases.")
    train_samples_per_step: int = Field(
        4,
        ge=0,
        description="Training rollouts kept per step (the first rows of the step's batch: "
        "prompt, completion, answer, reward, advantage) in `samples/train/step_*.jsonl`, next "
        "to the held-out samples; 0 keeps none.",
    )
    wandb_mode: Literal["online", "offline", "disabled"] = Field(
        "offline",
        description="W&B mode; `offline` writes locally for a later `wandb sync`. Read only "
        "when `logging.wandb=true`.",
    )
    wandb_project: str = Field(
        "posttrain",
        min_length=1,
        description="W&B project. Read only when `logging.wandb=true`.",
    )


class CheckpointConfig(Section):
    """How many checkpoints a run keeps (when to save is `rl.save_every`)."""

    section_name = "checkpoint"

    keep_last: int = Field(
        2, ge=1, description="Keep this many most recent checkpoints; older ones are deleted."
    )
    save_on_signal: bool = Field(
        True,
        description="On SIGINT/SIGTERM, finish the current step and save a checkpoint before "
        "exiting (a second signal stops at once); false stops at once without saving.",
    )
    export_final: bool = Field(
        True,
        description="When a run reaches `rl.max_steps`, write its final checkpoint as a plain "
        "Hugging Face folder, `RUN_DIR/final_model` (what `posttrain model export` writes: "
        "sharded checkpoints gathered layer by layer, LoRA adapters merged in; a replicated "
        "run's full-weight `model/` files are hard-linked). false leaves only the checkpoints.",
    )
    signal_grace_s: float = Field(
        120.0,
        gt=0,
        description="With `save_on_signal`, how long the first SIGINT/SIGTERM waits for the "
        "current step (and its save) to finish; past it the run stops as on a second signal, "
        "keeping the last complete checkpoint. Keep it below your scheduler's kill timeout.",
    )

    @field_validator("signal_grace_s")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be finite")
        return value
