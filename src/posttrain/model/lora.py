"""LoRA through peft: low-rank adapters train, the base stays frozen.

Three consequences the rest of the run relies on:

- **Reference without a copy.** The frozen base *is* the initial policy, so the KL reference is
  the same module with its adapters switched off (:class:`AdapterFreeReference`); no second set
  of weights is loaded.
- **Checkpoints hold adapters only.** ``save_pretrained`` on a peft model writes
  ``adapter_config.json`` + ``adapter_model.safetensors`` (loadable with
  ``PeftModel.from_pretrained(base, dir)``); ``trainer.model_io`` reads them back in place.
- **Weight sync sends adapters.** A rollout engine with its own copy of the model receives only
  the adapters and merges them onto its own float32 copy of the adapted base weights, as
  :func:`merged_state` merges (``W + (alpha / r) B A``), so its weights equal a merged sync's
  bit for bit (``placement/weight_sync.py``); the in-process engine shares the peft module
  itself and receives nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from posttrain.config.errors import ConfigError

ADAPTER = "default"


def _peft():
    try:
        import peft
    except ImportError as e:
        raise ConfigError(
            f"model.lora_rank > 0 needs peft ({e}); install it with pip install 'posttrain[lora]'"
        ) from None
    return peft


def apply_lora(
    model: nn.Module, rank: int, alpha: float, target_modules: Sequence[str], seed: int = 0
) -> nn.Module:
    """Wrap ``model`` with LoRA adapters (dropout 0, no bias); only the adapters train.

    ``A`` is drawn from ``seed`` (``B`` starts at zero), without touching the global RNG, so
    two runs with one seed start from the same adapters.
    """
    peft = _peft()
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return peft.get_peft_model(model, config)
    except ValueError as e:
        first = str(e).splitlines()[0]
        raise ConfigError(
            f"model.lora_target_modules={list(target_modules)}: {first}; name linear modules of "
            f"{type(model).__name__} (e.g. q_proj, v_proj)"
        ) from None


def is_lora(model: nn.Module) -> bool:
    """True for a peft-wrapped model (adapters present)."""
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


class AdapterFreeReference(nn.Module):
    """The LoRA policy with its adapters switched off and in eval mode: the frozen base.

    It holds the policy module itself (no copy); give it to a ``ReferenceScorer``, never to the
    trainer as an auxiliary model (its parameters are the policy's).
    """

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        if not is_lora(policy):
            raise ValueError("AdapterFreeReference needs a peft (LoRA) model")
        self.policy = policy

    def forward(self, **inputs):
        was_training = self.policy.training
        self.policy.eval()
        try:
            with self.policy.disable_adapter():
                return self.policy(**inputs)
        finally:
            self.policy.train(was_training)


@torch.no_grad()
def merged_state(model: nn.Module) -> dict[str, Tensor]:
    """The base model's state dict with every adapter merged in: ``W + delta`` per LoRA layer,
    under the names a plain (un-wrapped) model of the same architecture uses."""
    peft = _peft()
    base = model.get_base_model()
    deltas = {
        name: module.get_delta_weight(ADAPTER)
        for name, module in base.named_modules()
        if isinstance(module, peft.tuners.lora.LoraLayer)
    }
    out: dict[str, Tensor] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        if key.endswith(".base_layer.weight") and key[: -len(".base_layer.weight")] in deltas:
            name = key[: -len(".base_layer.weight")]
            out[f"{name}.weight"] = value + deltas[name].to(value.dtype)
        else:
            out[key.replace(".base_layer.", ".")] = value
    return out


def adapter_bytes(model: nn.Module) -> int:
    """Bytes of the trainable adapter tensors (what a checkpoint stores)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
