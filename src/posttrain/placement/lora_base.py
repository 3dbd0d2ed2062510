"""What a rollout with its own copy of a LoRA policy merges the adapters onto: the float32
weight of every adapted module as loaded (``placement/weight_sync.py``'s ``WeightSink``)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from posttrain.config import PosttrainConfig
from posttrain.model.loading import load_policy
from posttrain.placement.weight_sync import adapted_modules, plain_name


def policy_lora_base(policy: nn.Module) -> dict[str, Tensor]:
    """A LoRA policy's own frozen base weights, by the plain module names the rollout's model
    uses: what a rollout in the same process merges the adapters onto. They are the float32
    weights as loaded and never change, so no second float32 load is needed (on SmolLM2 that
    load and its kept copy were 0.56 + 0.43 GB of a bf16 run's peak)."""
    return {
        plain_name(f"{name}.base_layer.weight").removesuffix(
            ".weight"
        ): m.base_layer.weight.detach()
        for name, m in policy.named_modules()
        if hasattr(m, "lora_A") and isinstance(getattr(m, "base_layer", None), nn.Linear)
    }


def adapted_base(
    cfg: PosttrainConfig,
    model: nn.Module,
    dtype: str,
    device,
    shared: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """The float32 weight of every module LoRA adapts, as loaded: what the rollout merges the
    policy's adapters onto (``shared``: the policy's own, in the same process; else a float32
    load of its own when the rollout runs in another dtype)."""
    names = adapted_modules(model, cfg.model.lora_target_modules)
    if shared is not None:
        if set(shared) != set(names):
            raise ValueError(
                f"lora_base names {sorted(set(shared) ^ set(names))[:3]} differ from the "
                "rollout model's adapted modules"
            )
        return dict(shared)
    source = model
    if dtype != "float32":
        source, _ = load_policy(cfg.model.name_or_path, None, "float32", device)
    return {n: source.get_submodule(n).weight.detach().clone() for n in names}
