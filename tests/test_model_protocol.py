import dataclasses

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig

from posttrain.config import ConfigError
from posttrain.model.protocol import (
    ModelCapabilities,
    capabilities_from_config,
    model_capabilities,
    require_trainable,
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
        is_moe=False,
        kv_cache=True,
        position_ids=True,
        logits_to_keep=True,
        max_positions=64,
        vocab_size=40,
        dtype=torch.float64,
    )
    require_trainable(caps, "llama")
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.is_moe = True


def test_forward_keywords_are_read_from_the_signature():
    caps = capabilities_from_config(_llama(use_cache=True), torch.float32, forward_params={"x"})
    assert not (caps.kv_cache or caps.position_ids or caps.logits_to_keep)
    legacy = capabilities_from_config(
        _llama(), torch.float32, forward_params={"past_key_values", "position_ids"}
    )
    assert legacy.kv_cache and legacy.position_ids and not legacy.logits_to_keep
    with pytest.raises(ConfigError, match="does not accept logits_to_keep"):
        require_trainable(legacy, "old")


def test_moe_certification_is_refused():
    moe = MixtralConfig(num_local_experts=4, vocab_size=40)
    assert capabilities_from_config(moe, torch.float32).is_moe
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        capabilities_from_config(moe, torch.float32, certified_deterministic_forward=True)


class _NoPositions(nn.Module):
    """A model whose forward takes only input ids: the policy role refuses it up front."""

    def __init__(self):
        super().__init__()
        self.config = _llama()
        self.w = nn.Linear(2, 2)

    def forward(self, input_ids=None, attention_mask=None):
        raise AssertionError("never reached")


def test_policy_role_checks_capabilities_before_training(monkeypatch, tmp_path):
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.placement import roles

    monkeypatch.setattr(roles, "load_policy", lambda *a, **k: (_NoPositions(), None))
    cfg = load_config("arithmetic", ["--", f"job.output_root={tmp_path}"])
    with pytest.raises(ConfigError, match="does not accept position_ids, logits_to_keep"):
        roles.PolicyRole(cfg, build_objective, str(tmp_path))
