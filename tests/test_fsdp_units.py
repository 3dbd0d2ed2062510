"""In-process pieces of the FSDP path: its refusals (one line each) and the shard arithmetic."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from posttrain.trainer import sharding as sh


def test_unknown_sharding_is_refused():
    from posttrain.algorithm.primitives.objective import Objective
    from posttrain.trainer import Trainer

    objective = Objective(lambda m, b: (torch.zeros(()), {}))
    with pytest.raises(ValueError, match=r"sharding must be one of \('none', 'fsdp'\)"):
        Trainer(nn.Linear(2, 2), objective, lr=0.1, micro_batch_size=1, sharding="zero3")


def test_sharding_needs_a_process_group():
    with pytest.raises(ValueError, match="needs a torch.distributed group"):
        sh.shard_model(nn.Linear(2, 2), "float32")


def test_a_model_without_declared_layers_is_refused():
    with pytest.raises(ValueError, match="Linear declares none"):
        sh.decoder_layers(nn.Linear(2, 2))


def test_decoder_layers_of_a_hugging_face_model_and_its_lora_wrapping():
    from posttrain.model.lora import apply_lora
    from posttrain.model.tiny import tiny_config

    transformers = pytest.importorskip("transformers")
    model = transformers.LlamaForCausalLM(tiny_config("tiny"))
    assert len(sh.decoder_layers(model)) == 3
    lora = apply_lora(model, 2, 4.0, ["q_proj"], 0)
    layers = sh.decoder_layers(lora)
    assert len(layers) == 3 and all(type(m).__name__ == "LlamaDecoderLayer" for m in layers)


def test_grad_norm_and_clip_match_torch_on_one_process():
    torch.manual_seed(0)
    a, b = nn.Parameter(torch.randn(3, 4)), nn.Parameter(torch.randn(5))
    a.grad, b.grad = torch.randn(3, 4) * 3, torch.randn(5) * 3
    ref = [p.grad.clone() for p in (a, b)]
    want = float(torch.nn.utils.get_total_norm(ref))
    assert sh.grad_norm_([a, b], 0.0) == pytest.approx(want, rel=1e-6)  # float64 sum vs float32
    assert torch.equal(a.grad, ref[0])  # max_norm 0: no clipping
    x, y = nn.Parameter(torch.zeros(3, 4)), nn.Parameter(torch.zeros(5))
    x.grad, y.grad = ref[0].clone(), ref[1].clone()
    torch.nn.utils.clip_grad_norm_([x, y], 1.0)
    assert sh.grad_norm_([a, b], 1.0) == pytest.approx(want, rel=1e-6)  # float64 sum vs float32
    assert torch.allclose(a.grad, x.grad, rtol=1e-6) and torch.allclose(b.grad, y.grad, rtol=1e-6)
    assert float(torch.nn.utils.get_total_norm([a.grad, b.grad])) == pytest.approx(1.0, rel=1e-5)


def test_shard_bytes_counts_what_the_tensors_hold():
    lin = nn.Linear(4, 3)  # 12 + 3 parameters
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1)
    lin(torch.ones(2, 4)).sum().backward()
    opt.step()
    assert sh.shard_bytes(lin, opt) == {"params": 60, "grads": 60, "optimizer": 120}


def test_fsdp_without_ray_is_refused_by_preflight_in_one_line():
    from posttrain.config import PosttrainConfig, apply_overrides
    from posttrain.control import RULES, PreflightError, run_preflight

    def cfg(opts):
        return apply_overrides(PosttrainConfig(), opts)

    rule = next(r for r in RULES if r.name == "ray_knobs_need_ray")
    message = rule.check(cfg(["placement.policy_sharding=fsdp"]))
    assert message.startswith("placement.policy_sharding=fsdp is never read by placement.backend")
    assert "placement.policy_sharding=@default (-> 'none')" in message
    assert rule.check(cfg(["placement.policy_sharding=fsdp", "placement.backend=ray"])) is None
    with pytest.raises(PreflightError) as info:
        run_preflight(cfg(["placement.policy_sharding=fsdp"]))
    assert message in info.value.violations and "\n" not in str(info.value)


def test_a_sharded_model_scores_through_its_root_forward(tmp_path):
    """The head-in-chunks and head-at-trained-tokens paths call the decoder and the head
    directly; on an FSDP root that would meet bare shards (the root's forward gathers the
    embeddings and head), so a sharded model scores through its own forward: the same values
    as the unsharded model (one gloo rank). Nor does it share prompts: a shared prompt takes
    two forwards where a lone row takes one, and sharded ranks run theirs in step."""
    import copy

    import torch.distributed as dist

    from posttrain.data.logprobs import masked_response_logprobs, response_logprobs
    from posttrain.data.prefix import unsupported_reason
    from posttrain.model.tiny import tiny_config

    transformers = pytest.importorskip("transformers")
    from conftest import random_batch

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_config("tiny")).eval()
    batch = random_batch(seed=3, b=4, vocab=model.config.vocab_size)
    want = response_logprobs(model, batch)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0,
                            world_size=1)  # fmt: skip
    try:
        sharded = copy.deepcopy(model)
        sh.shard_model(sharded, "float32")
        with torch.no_grad():
            chunked = response_logprobs(sharded, batch, chunk_elements=1)  # would chunk the head
            masked = masked_response_logprobs(sharded, batch)
        reason = unsupported_reason(sharded)
    finally:
        dist.destroy_process_group()
    assert torch.allclose(chunked, want, atol=1e-6, rtol=0)
    mask = batch.response_mask
    assert torch.allclose(masked[mask], want[mask], atol=1e-6) and not masked[~mask].any()
    assert unsupported_reason(model) is None and "FSDP-sharded" in reason
