import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig

from posttrain.model.protocol import (
    DEFAULT_NOISE_TOLERANCE,
    ModelCapabilities,
    capabilities_from_config,
    model_capabilities,
)


def _llama(**kw):
    return LlamaConfig(
        vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=64, **kw,
    )  # fmt: skip


def test_dense_model_capabilities_from_a_loaded_model():
    caps = model_capabilities(LlamaForCausalLM(_llama()).double())
    assert caps == ModelCapabilities(
        certified_deterministic_forward=False,
        forward_noise_tolerance=DEFAULT_NOISE_TOLERANCE[torch.float64],
        is_moe=False,
        routing_replay=False,
        kv_cache=True,
        position_ids=True,
        logits_to_keep=True,
        max_positions=64,
        vocab_size=40,
        dtype=torch.float64,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.is_moe = True


def test_certification_zeroes_the_tolerance_and_overrides_apply():
    cfg = _llama()
    assert (
        capabilities_from_config(
            cfg, torch.float32, certified_deterministic_forward=True
        ).forward_noise_tolerance
        == 0.0
    )
    caps = capabilities_from_config(cfg, torch.bfloat16)
    assert caps.forward_noise_tolerance == DEFAULT_NOISE_TOLERANCE[torch.bfloat16]
    assert capabilities_from_config(cfg, torch.float32, forward_noise_tolerance=0.5)\
        .forward_noise_tolerance == 0.5  # fmt: skip
    with pytest.raises(ValueError, match="forward_noise_tolerance must be >= 0"):
        capabilities_from_config(cfg, torch.float32, forward_noise_tolerance=-1.0)


def test_forward_keywords_are_read_from_the_signature():
    caps = capabilities_from_config(_llama(use_cache=True), torch.float32, forward_params={"x"})
    assert not (caps.kv_cache or caps.position_ids or caps.logits_to_keep)
    legacy = capabilities_from_config(
        _llama(), torch.float32, forward_params={"past_key_values", "position_ids"}
    )
    assert legacy.kv_cache and legacy.position_ids and not legacy.logits_to_keep


def test_moe_rules():
    moe = MixtralConfig(num_local_experts=4, vocab_size=40)
    caps = capabilities_from_config(moe, torch.float32)
    assert caps.is_moe and not caps.routing_replay
    with pytest.raises(ValueError, match="mixture-of-experts model without routing replay"):
        capabilities_from_config(moe, torch.float32, certified_deterministic_forward=True)
    ok = capabilities_from_config(
        moe, torch.float32, certified_deterministic_forward=True, routing_replay=True
    )
    assert ok.certified_deterministic_forward and ok.routing_replay
    with pytest.raises(ValueError, match="routing_replay=true but the model is dense"):
        capabilities_from_config(_llama(), torch.float32, routing_replay=True)
