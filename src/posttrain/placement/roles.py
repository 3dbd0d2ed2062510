"""The roles of an online RL run, as plain classes with plain methods.

A role takes the resolved config of its process: ``placement.local`` resolves once for all the
roles it builds in the driver; a Ray actor resolves ``config_path`` plus the override list in its
own process (``ray_host``), so it sees exactly what the driver resolved, never a pickled driver
object. Both construct these same classes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from posttrain.algorithm.primitives.objective import DataSideReference
from posttrain.config import PosttrainConfig, to_dict
from posttrain.config.build import needs_reference, objective_context, reference_on_data
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.env.episode import TurnRequest
from posttrain.model.loading import load_policy
from posttrain.model.lora import AdapterFreeReference, apply_lora
from posttrain.model.protocol import model_capabilities, require_trainable
from posttrain.placement.device import rollout_dtype
from posttrain.placement.lora_base import adapted_base
from posttrain.placement.reference_reset import ReferenceReset, ResettableAdapterReference
from posttrain.placement.reward_role import RewardRole, load_role_tokenizer  # noqa: F401 (a role)
from posttrain.placement.weight_sync import (
    WeightSink,
    WeightSource,
    bucket_bytes,
)
from posttrain.rollout.base import Rollout
from posttrain.rollout.registry import build_engine, engine_capabilities
from posttrain.trainer import CheckpointManager, LLMTrainer, ResumeState
from posttrain.trainer import distributed as dp

ObjectiveBuilder = Callable[[Any, Any], Any]


class PolicyRole:
    """Owns the policy model, its objective, the trainer and checkpoints (one data-parallel rank)."""

    def __init__(
        self,
        config: PosttrainConfig,
        build_objective_fn: ObjectiveBuilder,
        run_dir: str,
        device: str | None = None,
    ) -> None:
        self.config = cfg = config
        # Master weights stay float32; model.dtype=bfloat16 becomes bf16 autocast in the trainer.
        # A sharded rank other than 0 builds a meta-device skeleton: rank 0 sends its shards.
        skeleton = cfg.placement.policy_sharding == "fsdp" and dp.rank() > 0
        self.model, self.tokenizer = load_policy(
            cfg.model.name_or_path, cfg.model.tokenizer_path, "float32", device, skeleton
        )
        claim = cfg.model.certified_deterministic_forward
        self.capabilities = model_capabilities(self.model, certified_deterministic_forward=claim)
        require_trainable(self.capabilities, cfg.model.name_or_path)
        m = cfg.model
        reference, auxiliary = None, ()
        reads_kl = needs_reference(cfg)  # the objective's declaration reads rl.kl_beta > 0
        if reads_kl and reference_on_data(cfg):  # scored before the update (placement/reference)
            reads_kl, reference = False, DataSideReference()
        if m.lora_rank:
            self.model = apply_lora(
                self.model, m.lora_rank, m.lora_alpha, m.lora_target_modules, cfg.job.seed
            )
            if reads_kl and cfg.rl.reference_reset_every:  # base + frozen adapters after a reset
                reference = ResettableAdapterReference(self.model)
            elif reads_kl:  # the frozen base itself, adapters off: no second copy
                reference = AdapterFreeReference(self.model)
        elif reads_kl:  # sharded like the policy under FSDP (the trainer shards auxiliaries)
            reference, _ = load_policy(
                cfg.model.name_or_path, None, cfg.model.dtype, device, skeleton
            )
            auxiliary = (reference,)
        self.objective = build_objective_fn(cfg.rl, objective_context(cfg, reference))
        rl = cfg.rl
        self.trainer = LLMTrainer(
            self.model,
            self.objective,
            lr=rl.lr,
            micro_batch_size=rl.micro_batch_size,
            optimizer=rl.optimizer,
            weight_decay=rl.weight_decay,
            betas=(rl.adam_beta1, rl.adam_beta2),
            grad_clip=rl.grad_clip,
            lr_schedule=rl.lr_schedule,
            warmup_steps=rl.warmup_steps,
            total_steps=rl.max_steps * rl.mini_batch_per_replica,
            precision=cfg.model.dtype,
            gradient_checkpointing=cfg.model.gradient_checkpointing,
            compile=cfg.model.compile,
            max_consecutive_nonfinite=rl.max_consecutive_nonfinite,
            certified_deterministic_forward=cfg.model.certified_deterministic_forward,
            shared_prefix=rl.shared_prefix,
            micro_batch_tokens=rl.micro_batch_tokens,
            auxiliary_models=auxiliary,
            device=device,
            sharding=cfg.placement.policy_sharding,
        )
        self.reset: ReferenceReset | None = None
        if reads_kl and rl.reference_reset_every:
            self.reset = ReferenceReset(
                self.model, reference, self.trainer.optimizer, rl.reference_reset_every,
                rl.reset_optimizer,
            )  # fmt: skip
            self.trainer.extra_state["reference_reset"] = self.reset
        self.checkpoints = CheckpointManager(
            Path(run_dir) / "checkpoints", keep_last=cfg.checkpoint.keep_last
        )
        self._source: WeightSource | None = None

    def resume(self) -> ResumeState | None:
        return self.checkpoints.resume(
            self.trainer, mode=self.config.rl.resume, config=to_dict(self.config)
        )

    def train(self, batch: TrajectoryBatch) -> dict[str, float]:
        rows = self.trainer.train_on_batch(
            batch, mini_batches=self.config.rl.mini_batch_per_replica
        )
        metrics = self.trainer.merge(rows)
        if self.reset is not None:
            metrics.update(self.reset.after_update(metrics))
        return metrics

    def keeps_groups(self) -> bool:
        """Whether the rank dispatch may bring a mini-batch's groups together (the trainer's
        rule, asked once by a placement that splits batches over ranks)."""
        return self.trainer.keeps_groups

    def sync_buckets(self) -> int:
        """How many :meth:`weight_bucket` calls one weight sync takes."""
        return len(self._weights().buckets)

    def weight_bucket(self, k: int, wire: bool = False) -> dict[str, Any]:
        """Bucket ``k`` of a weight sync, as CPU tensors (``wire``: numpy views of them, which
        the object store takes without a copy): every weight under the plain model's names,
        tied tensors once; with LoRA only the adapters (``placement/weight_sync.py``). A sharded
        policy gathers the bucket (every rank must call this; rank 0 returns it, the others
        ``{}``)."""
        return self._weights().bucket(k, wire)

    def _weights(self) -> WeightSource:
        if self._source is None:
            limit = bucket_bytes(self.config.placement.sync_bucket_mb)
            adapters = None if sends_adapters(self.config) else False  # None: if LoRA
            self._source = WeightSource(self.model, limit, adapters)
        return self._source

    def save(self, step: int, data_state: Mapping[str, Any]) -> str:
        path = self.checkpoints.save(
            step, self.trainer, config=to_dict(self.config), data_state=dict(data_state),
            tokenizer=self.tokenizer,
        )  # fmt: skip
        return str(path)


class RolloutRole:
    """Samples responses. Given ``model``, it samples with that very module (in-process sharing:
    weight sync then copies nothing); otherwise it loads its own copy from the config.

    An own copy has ``rollout.dtype`` (``auto``: bfloat16 where the device has native bf16
    matmuls, else float32 like the policy's master weights, so both placements draw the same
    tokens for the same seed) and
    receives the policy's weights bucket by bucket (``placement/weight_sync.py``); with LoRA it
    keeps a float32 copy of the adapted base weights, onto which it merges the adapters it
    receives.
    """

    def __init__(
        self,
        config: PosttrainConfig,
        model: nn.Module | None = None,
        device: str | None = None,
        lora_base: Mapping[str, Tensor] | None = None,
    ) -> None:
        self.config = cfg = config
        own = model is None
        if not engine_capabilities(cfg.rollout.engine).in_process:
            if not own:
                raise ValueError(f"rollout.engine={cfg.rollout.engine} cannot share a module")
            self.engine, self.tokenizer = _out_of_process_engine(cfg, device)
            self.sink = WeightSink(self.engine)
            return
        if own:
            dtype = rollout_dtype(cfg.rollout.dtype, device)
            model, tokenizer = load_policy(
                cfg.model.name_or_path, cfg.model.tokenizer_path, dtype, device
            )
        else:
            tokenizer = load_role_tokenizer(cfg)
        self.tokenizer = tokenizer
        self.engine = build_engine(cfg.rollout.engine, model, tokenizer)
        self.sink: WeightSink | None = None
        if own:
            m = cfg.model
            base = None
            if m.lora_rank:
                base = adapted_base(cfg, model, dtype, device, lora_base)
            self.sink = WeightSink(self.engine, base, m.lora_alpha / max(m.lora_rank, 1))

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int,
        temperature: float,
        seed: int,
        group_id_offset: int = 0,
        sample_id_offset: int = 0,
    ) -> Rollout:
        """Sample; the result is on the CPU (it travels to the reward stage, maybe elsewhere)."""
        r = self.config.rollout
        out = self.engine.generate(
            prompts, n=n, temperature=temperature, top_p=r.top_p if temperature > 0 else 1.0,
            max_tokens=r.max_tokens, seed=seed, group_id_offset=group_id_offset,
            sample_id_offset=sample_id_offset,
        )  # fmt: skip
        if out.truncated.device.type == "cpu":
            return out
        return dataclasses.replace(out, batch=out.batch.to("cpu"), truncated=out.truncated.cpu())

    def generate_turns(
        self, requests: Sequence[TurnRequest], *, temperature: float, top_p: float, seed: int
    ) -> list[tuple[list[int], list[float]]]:
        """One turn of a multi-turn rollout (``rollout.multiturn``); ``[]`` frees its caches."""
        if not requests:
            self.engine.end_turns()
            return []
        return self.engine.generate_turns(requests, temperature=temperature, top_p=top_p,
                                          seed=seed)  # fmt: skip

    def end_turns(self) -> None:
        """The multi-turn rollout is over: the engine frees its turn caches."""
        self.engine.end_turns()

    def shares(self, module: nn.Module) -> bool:
        """Whether the engine samples with ``module`` itself (in-process: a sync copies nothing)."""
        return self.engine.shares(module)

    def close(self) -> None:
        """An engine with a process of its own (vLLM) ends it; in-process engines hold none."""
        close = getattr(self.engine, "close", None)
        if close is not None:
            close()

    def sync(self, weights: nn.Module | Mapping[str, Any], final: bool = True) -> int:
        """Take the policy module itself (in-process sharing), or one bucket of a sync
        (``final`` for the last); returns the engine's weight version."""
        if isinstance(weights, nn.Module):
            if not self.engine.shares(weights):
                raise ValueError(
                    "a rollout with its own weights takes them bucket by bucket, not as a module"
                )
            receiver = self.engine.weight_receiver()
            receiver.begin()  # the engine samples with the module: nothing to copy
            return receiver.end()
        if self.sink is None:
            raise ValueError("a rollout that shares the policy module receives no weights")
        else:
            self.sink.receive(weights, final)
        return self.engine.weight_version


def sends_adapters(cfg: PosttrainConfig) -> bool:
    """Whether a LoRA policy's syncs send its adapters alone (else its merged full weights):
    an engine that merges them onto a base copy of its own always does; vLLM does with
    ``vllm.lora_sync=adapter`` (its LoRA path), and reloads merged weights otherwise."""
    if engine_capabilities(cfg.rollout.engine).adapter_sync:
        return True
    return cfg.rollout.engine == "vllm" and cfg.vllm.lora_sync == "adapter"


def _out_of_process_engine(cfg: PosttrainConfig, device: str | None):
    """An engine in its own process (``rollout.engine=vllm``): the policy's architecture as a
    meta-device skeleton (weight names and ties; no weights read here), the tokenizer, and the
    engine loading the model folder itself; the run's first sync sends the policy's weights."""
    skeleton, tokenizer = load_policy(
        cfg.model.name_or_path, cfg.model.tokenizer_path, "float32", None, skeleton=True
    )
    engine = build_engine(
        cfg.rollout.engine, skeleton, tokenizer, weights_from=cfg.model.name_or_path,
        options=vllm_options(cfg, device),
    )  # fmt: skip
    return engine, tokenizer


def vllm_options(cfg: PosttrainConfig, device: str | None):
    """The ``vllm`` section, the rollout dtype and (when vLLM applies them itself) the LoRA
    adapters' shape, as the vLLM engine takes them."""
    from posttrain.rollout.vllm_engine import VllmOptions

    v, m = cfg.vllm, cfg.model
    adapters = bool(m.lora_rank) and sends_adapters(cfg)
    return VllmOptions(
        dtype=rollout_dtype(cfg.rollout.dtype, device), kv_cache_space_gib=v.kv_cache_space_gib,
        max_model_len=v.max_model_len, enforce_eager=v.enforce_eager,
        enable_prefix_caching=v.enable_prefix_caching,
        tensor_parallel_size=v.tensor_parallel_size,
        gpu_memory_utilization=v.gpu_memory_utilization, device=device,
        lora_rank=m.lora_rank if adapters else 0, lora_alpha=m.lora_alpha if adapters else 0.0,
        lora_targets=tuple(m.lora_target_modules) if adapters else (),
    )  # fmt: skip
