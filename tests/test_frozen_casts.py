"""The bf16 copies of frozen linear weights (trainer/frozen_casts.py) change no number: a LoRA
update in bf16 is bit for bit the one plain autocast computes, also after a frozen weight
changes in place, and the modules hold their float32 weights outside the forward."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from test_bf16_cpu import _bf16_opts

from posttrain.config import load_config
from posttrain.config.build import build_objective
from posttrain.model.tiny import build_tiny_model
from posttrain.placement.local import place_local
from posttrain.testing import synthetic_batch
from posttrain.trainer.frozen_casts import FrozenCasts


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def _policy(tiny_dir, tmp_path):
    # LoRA with a KL term: the reference is the base with the adapters off, inside the update.
    opts = _bf16_opts(tiny_dir, tmp_path, "model.lora_rank=4", "rl.kl_beta=0.1")
    config = load_config("arithmetic_clipped", ["--", *opts])
    return place_local(config, build_objective, str(tmp_path)).policy


def _base_layer(model) -> torch.nn.Linear:
    return next(m.base_layer for m in model.modules() if hasattr(m, "base_layer"))


def _train(policy, batches) -> tuple[list[dict], dict[str, torch.Tensor]]:
    metrics = [policy.trainer.train_on_batch(b) for b in batches]
    params = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    return metrics, params


def test_frozen_weights_are_cast_once_and_swapped_only_inside_the_forward(tiny_dir, tmp_path):
    policy = _policy(tiny_dir, tmp_path)
    base = _base_layer(policy.model)
    own = base.weight
    head = policy.model.get_output_embeddings()
    with policy.trainer.forward_context():
        first = base.weight
        assert first.dtype == torch.bfloat16 and torch.equal(first, own.to(torch.bfloat16))
        assert head.weight.dtype == torch.bfloat16  # the tied head is frozen under LoRA too
    with policy.trainer.forward_context():
        assert base.weight is first  # cast once, reused by the next forward
    assert base.weight is own and own.dtype == torch.float32
    with torch.no_grad():
        own.add_(1.0)  # changed in place (a checkpoint load): the copy is renewed
    with policy.trainer.forward_context():
        assert base.weight is not first and torch.equal(base.weight, own.to(torch.bfloat16))
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    with policy.trainer.forward_context():
        assert all(p.dtype == torch.float32 for p in trainable)  # autocast's own business


def test_a_bf16_lora_update_is_bit_for_bit_the_plain_autocast_one(tiny_dir, tmp_path, monkeypatch):
    vocab = 64  # ids below the tiny preset's 99-entry vocabulary
    batches = [synthetic_batch(vocab, 4, seed=s) for s in (1, 2)]
    cached = _policy(tiny_dir, tmp_path / "a")
    with_copies = _train(cached, batches)
    with torch.no_grad():  # then a frozen weight moves in place: the next update must see it
        _base_layer(cached.model).weight.mul_(1.5)
    with_copies_after = _train(cached, batches[:1])

    monkeypatch.setattr(FrozenCasts, "swapped", lambda self: contextlib.nullcontext())
    plain = _policy(tiny_dir, tmp_path / "b")
    without = _train(plain, batches)
    with torch.no_grad():
        _base_layer(plain.model).weight.mul_(1.5)
    without_after = _train(plain, batches[:1])

    for got, want in ((with_copies, without), (with_copies_after, without_after)):
        assert got[0] == want[0]  # every metric of every step, exactly
        assert got[1].keys() == want[1].keys()
        for name, p in got[1].items():
            assert torch.equal(p, want[1][name]), name


def test_the_copies_live_for_one_collected_batch_and_survive_a_nested_region(tiny_dir, tmp_path):
    policy = _policy(tiny_dir, tmp_path)
    trainer, base = policy.trainer, _base_layer(policy.model)
    with trainer.forward_context():
        first = base.weight
        with trainer.forward_context():  # entered again from inside: nothing changes
            assert base.weight is first
        assert base.weight is first
    with trainer.forward_context():
        assert base.weight is first  # the inner exit dropped no copy
    trainer.train_on_batch(synthetic_batch(64, 4, seed=1))
    assert not trainer._frozen_casts._copies  # dropped at the batch's end: none through a rollout


def test_a_failing_swap_leaves_no_autocast_behind(tiny_dir, tmp_path, monkeypatch):
    policy = _policy(tiny_dir, tmp_path)

    def fail(self, weight):
        raise MemoryError("no room for the copy")

    monkeypatch.setattr(FrozenCasts, "_copy", fail)
    with pytest.raises(MemoryError), policy.trainer.forward_context():
        pass
    assert not torch.is_autocast_enabled("cpu")
    assert _base_layer(policy.model).weight.dtype == torch.float32


def test_gradient_checkpointing_keeps_autocast_s_own_casts(tiny_dir, tmp_path):
    """Its recomputed forwards run outside the region and cast anyway; copies of every layer
    would only add memory."""
    opts = _bf16_opts(tiny_dir, tmp_path, "model.lora_rank=4", "model.gradient_checkpointing=true")
    config = load_config("arithmetic_clipped", ["--", *opts])
    policy = place_local(config, build_objective, str(tmp_path)).policy
    with policy.trainer.forward_context():
        assert _base_layer(policy.model).weight.dtype == torch.float32
