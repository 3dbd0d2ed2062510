"""Preflight for ``rollout.engine=vllm``: its environment, its section, and the sampler gap.

The engine samples single- and multi-turn rollouts for the online entries (GRPO, OPD) in a
process of its own, started by the rollout role wherever the role runs (in the driver, or in
its Ray actor, also on the data side of a lag), and takes full weights after every update, or
a LoRA policy's adapters through vLLM's LoRA path (``vllm.lora_sync``). The ``vllm`` section is
read only with it.
"""

from __future__ import annotations

from posttrain.config.schema import PosttrainConfig
from posttrain.control.reads import reads_or_none
from posttrain.control.rules import are, changed, error, warning

_KNOBS = (
    "kv_cache_space_gib", "max_model_len", "enforce_eager", "enable_prefix_caching",
    "tensor_parallel_size", "gpu_memory_utilization", "lora_sync",
)  # fmt: skip
#: The largest adapter rank vLLM's LoRA path takes (its ``max_lora_rank`` choices end there).
VLLM_MAX_LORA_RANK = 512


def _on(cfg: PosttrainConfig) -> bool:
    return cfg.rollout.engine == "vllm"


@error("rollout.engine", *(f"vllm.{k}" for k in _KNOBS))
def vllm_section_needs_the_engine(cfg: PosttrainConfig) -> str | None:
    """The ``vllm`` section configures vLLM's engine; with another engine nothing reads it."""
    knobs = changed(cfg.vllm, *_KNOBS)
    if _on(cfg) or not knobs:
        return None
    return (
        f"{are(knobs)} read only with rollout.engine=vllm (got rollout.engine="
        f"{cfg.rollout.engine}); set rollout.engine=vllm or remove them"
    )


@error("rollout.engine")
def vllm_environment_exists(cfg: PosttrainConfig) -> str | None:
    """vLLM lives in its own environment (``.venv-vllm``); without it the run could not start
    its rollout process."""
    if not _on(cfg):
        return None
    from posttrain.rollout.vllm_process import missing_vllm_message, vllm_python

    return missing_vllm_message() if vllm_python() is None else None


@error("rollout.engine", "vllm.lora_sync", "model.lora_rank")
def vllm_lora_sync_needs_lora(cfg: PosttrainConfig) -> str | None:
    """How adapters reach vLLM means nothing for a policy without adapters."""
    if not _on(cfg) or cfg.model.lora_rank or cfg.vllm.is_default("lora_sync"):
        return None
    return (
        f"vllm.lora_sync={cfg.vllm.lora_sync} is read only with a LoRA policy (got "
        "model.lora_rank=0); set model.lora_rank or remove vllm.lora_sync"
    )


@error("rollout.engine", "vllm.lora_sync", "model.lora_rank")
def vllm_lora_rank_fits(cfg: PosttrainConfig) -> str | None:
    """vLLM's LoRA path plans its adapter buffers for a rank of at most 512."""
    m = cfg.model
    if not _on(cfg) or cfg.vllm.lora_sync != "adapter" or m.lora_rank <= VLLM_MAX_LORA_RANK:
        return None
    return (
        f"model.lora_rank={m.lora_rank} with vllm.lora_sync=adapter: vLLM's LoRA path takes "
        f"ranks up to {VLLM_MAX_LORA_RANK}; use vllm.lora_sync=merged or a smaller rank"
    )


@warning("rollout.engine", "vllm.lora_sync", "vllm.enforce_eager", "model.lora_rank")
def vllm_lora_runs_eager(cfg: PosttrainConfig) -> str | None:
    """vLLM's CPU build switches compilation off for a model with LoRA enabled, silently."""
    v = cfg.vllm
    if not _on(cfg) or not cfg.model.lora_rank or v.lora_sync != "adapter" or v.enforce_eager:
        return None
    return (
        "vllm.enforce_eager=false with vllm.lora_sync=adapter: vLLM's CPU build runs a model "
        "with LoRA enabled eager (its GPU builds compile it); for compiled sampling on the CPU "
        "use vllm.lora_sync=merged"
    )


@warning("rollout.engine", "rl.rollout_is_cap")
def vllm_without_is_correction(cfg: PosttrainConfig) -> str | None:
    """vLLM samples with other kernels (and maybe bf16) than the trainer's forward that scores
    π_old: the truncated importance weight corrects for the gap it publishes
    (``train/rollout/logprob_abs_diff``)."""
    reads = reads_or_none(cfg)
    if not _on(cfg) or cfg.rl.rollout_is_cap > 0 or reads is None:
        return None
    if not reads.reads("rl.rollout_is_cap"):
        return None
    return (
        "rl.rollout_is_cap=0 with rollout.engine=vllm: vLLM's log-probs differ from the "
        "trainer's (float32: ~1e-5, bf16: up to ~0.4) and nothing corrects for it; leave "
        "rl.rollout_is_cap unset (2.0 with this engine)"
    )


@error("rollout.engine", "vllm.tensor_parallel_size", "model.name_or_path")
def vllm_heads_split_evenly(cfg: PosttrainConfig) -> str | None:
    """vLLM gives each tensor-parallel worker an equal share of the attention heads, and of the
    key/value heads or a copy of one (so the two counts divide one way or the other); other
    counts are refused inside ``LLM()`` as a traceback from vLLM's engine."""
    tp = cfg.vllm.tensor_parallel_size
    if not _on(cfg) or tp == 1:
        return None
    from posttrain.control.memory import model_shape

    shape = model_shape(cfg)
    if shape is None:
        return None
    if shape.heads % tp:
        return (
            f"vllm.tensor_parallel_size={tp}: the model has {shape.heads} attention heads, "
            f"which vLLM cannot share out evenly over {tp} workers; use a divisor of "
            f"{shape.heads}"
        )
    if shape.kv_heads % tp and tp % shape.kv_heads:
        return (
            f"vllm.tensor_parallel_size={tp}: the model has {shape.kv_heads} key/value heads, "
            f"which vLLM can neither share out over {tp} workers nor copy to each; use a "
            f"divisor or a multiple of {shape.kv_heads}"
        )
    return None


@error("rollout.engine", "vllm.tensor_parallel_size", "placement.gpus_per_role")
def vllm_workers_have_gpus(cfg: PosttrainConfig) -> str | None:
    """Under Ray the rollout actor sees the GPUs it was given, and each tensor-parallel worker
    of a GPU build takes one: fewer would fail only once vLLM starts in the actor."""
    tp, gpus = cfg.vllm.tensor_parallel_size, cfg.placement.gpus_per_role
    if not _on(cfg) or cfg.placement.backend != "ray" or gpus <= 0 or tp <= gpus:
        return None
    return (
        f"vllm.tensor_parallel_size={tp} with placement.gpus_per_role={gpus:g}: the rollout "
        f"actor would see {gpus:g} GPU(s) for {tp} vLLM workers; raise "
        "placement.gpus_per_role or lower vllm.tensor_parallel_size"
    )


RULES = (
    vllm_section_needs_the_engine,
    vllm_workers_have_gpus,
    vllm_heads_split_evenly,
    vllm_environment_exists,
    vllm_without_is_correction,
    vllm_lora_sync_needs_lora,
    vllm_lora_rank_fits,
    vllm_lora_runs_eager,
)
