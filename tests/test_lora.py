"""LoRA through peft: trainable adapters only, the adapter-free base as reference, merged sync,
adapter checkpoints loadable with peft, and exact resume through the GRPO entry."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import random_batch, tiny_llama
from test_entry_grpo import _strip_timing, metrics_of, quick_opts, train

from posttrain.config import ConfigError
from posttrain.data.logprobs import response_logprobs
from posttrain.model.lora import AdapterFreeReference, adapter_bytes, apply_lora, merged_state
from posttrain.model.tiny import build_tiny_model

peft = pytest.importorskip("peft")

TARGETS = ["q_proj", "v_proj"]


def _lora(seed: int = 0):
    base = tiny_llama(seed)
    frozen = copy.deepcopy(base)
    model = apply_lora(base, 2, 4.0, TARGETS)
    torch.manual_seed(1)
    with torch.no_grad():  # B starts at zero; give the adapters a non-trivial update
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    return model, frozen


def test_only_adapters_train_and_their_size():
    model, _ = _lora()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # 1 layer x 2 modules x (A: 2 x 16, B: 16 x 2) float64 values
    assert adapter_bytes(model) == 2 * (2 * 16 + 16 * 2) * 8


def test_reference_is_the_frozen_base_without_a_copy():
    model, frozen = _lora()
    batch = random_batch()
    model.train()
    ref = AdapterFreeReference(model)
    torch.testing.assert_close(response_logprobs(ref, batch), response_logprobs(frozen, batch))
    assert model.training  # the reference's eval switch is undone
    assert not torch.allclose(response_logprobs(model, batch), response_logprobs(frozen, batch))
    ids = {id(p) for p in model.parameters()}
    assert {id(p) for p in ref.parameters()} == ids  # the same tensors, nothing loaded twice


def test_merged_state_loads_into_a_plain_model_and_scores_like_the_adapters():
    model, frozen = _lora()
    state = merged_state(model)
    assert state.keys() == frozen.state_dict().keys()
    frozen.load_state_dict(state, strict=True)
    batch = random_batch()
    torch.testing.assert_close(
        response_logprobs(frozen, batch), response_logprobs(model, batch), rtol=1e-10, atol=1e-10
    )


def test_unknown_target_module_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match=r"model.lora_target_modules=\['qq_proj'\]") as info:
        apply_lora(tiny_llama(), 2, 4.0, ["qq_proj"])
    assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


LORA = {
    "rl.grpo_surrogate": "clipped",
    "model.lora_rank": 4,
    "model.lora_alpha": 8,
    "rl.kl_beta": 0.05,
    "rl.entropy_coef": 0.1,
    "rl.lr": 1e-3,
}


def test_lora_run_saves_peft_adapters_and_resumes_exactly(tmp_path, tiny_dir):
    straight = train(quick_opts(tmp_path / "a", tiny_dir, **LORA))
    rows = metrics_of(straight)
    assert rows[-1]["train/pg/kl_ref"] > 0  # adapters moved the policy away from the base
    assert rows[-1]["train/pg/entropy"] > 0
    ckpt = Path(straight["run_dir"]) / "checkpoints" / "step_00000004" / "model"
    assert (ckpt / "adapter_model.safetensors").exists() and not (
        ckpt / "model.safetensors"
    ).exists()
    # The adapters load with plain peft onto the base model and change its outputs.
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_dir)
    loaded = peft.PeftModel.from_pretrained(copy.deepcopy(base), ckpt)
    batch = random_batch(vocab=base.config.vocab_size)
    assert not torch.allclose(response_logprobs(loaded, batch), response_logprobs(base, batch))
    # Stop after step 2, resume for steps 3-4: the same metrics as the straight run.
    train(quick_opts(tmp_path / "b", tiny_dir, **{**LORA, "rl.max_steps": 2}))
    resumed = train(quick_opts(tmp_path / "b", tiny_dir, **LORA))
    assert resumed["start_step"] == 2
    assert _strip_timing(metrics_of(resumed)) == _strip_timing(rows)


def test_sync_to_an_own_copy_sends_adapters_and_scores_like_the_policy(tmp_path, tiny_dir):
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.placement.local import LocalRoles
    from posttrain.placement.roles import PolicyRole, RolloutRole

    config = load_config("arithmetic", ["--", *quick_opts(tmp_path, tiny_dir, **LORA)])
    policy = PolicyRole(config, build_objective, str(tmp_path / "run"))
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    rollout = RolloutRole(config)  # its own plain copy, as on another machine
    roles = LocalRoles(policy, rollout, None)
    roles.sync_weights()  # the adapters only (tests/test_weight_sync.py checks the bits)
    assert roles.last_sync["sync/bytes"] == adapter_bytes(policy.model)
    batch = random_batch(vocab=policy.model.config.vocab_size)
    torch.testing.assert_close(
        response_logprobs(rollout.engine.model, batch),
        response_logprobs(policy.model, batch),
        rtol=1e-5,
        atol=1e-5,
    )
