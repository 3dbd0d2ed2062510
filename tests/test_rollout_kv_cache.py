import pytest
import torch
from transformers import LlamaConfig
from transformers.cache_utils import DynamicLayer

from posttrain.rollout.kv_cache import PreallocatedLayer, rollout_cache


def _kv(b, t, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, t, 3, generator=g), torch.randn(b, 2, t, 3, generator=g)


def test_preallocated_layer_matches_dynamic_layer():
    ours, ref = PreallocatedLayer(capacity=12), DynamicLayer()
    steps = [
        ("update", _kv(2, 4, 0)),
        ("repeat", 3),
        ("update", _kv(6, 1, 1)),
        ("select", torch.tensor([5, 0, 2])),
        ("update", _kv(3, 2, 2)),
        ("reorder", torch.tensor([2, 0, 1])),
        ("crop", -2),
        ("update", _kv(3, 1, 3)),
    ]
    for op, arg in steps:
        if op == "update":
            a, b = ours.update(*arg), ref.update(*arg)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        elif op == "repeat":
            ours.batch_repeat_interleave(arg)
            ref.batch_repeat_interleave(arg)
        elif op == "select":
            ours.batch_select_indices(arg)
            ref.batch_select_indices(arg)
        elif op == "reorder":
            ours.reorder_cache(arg)
            ref.reorder_cache(arg)
        else:
            ours.crop(arg)
            ref.crop(arg)
        assert ours.get_seq_length() == ref.get_seq_length()
        assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)
    assert ours.get_seq_length() == 6
    assert ours.get_mask_sizes(1) == ref.get_mask_sizes(1) == (7, 0)


def test_capacity_overflow_and_reset():
    layer = PreallocatedLayer(capacity=3)
    layer.update(*_kv(1, 3, 0))
    with pytest.raises(RuntimeError, match="capacity 3 exceeded"):
        layer.update(*_kv(1, 1, 1))
    layer.reset()
    assert layer.get_seq_length() == 0 and not layer.is_initialized
    with pytest.raises(ValueError, match="negative"):
        layer.crop(1)


def test_rollout_cache_swaps_only_full_attention_layers():
    full = LlamaConfig(num_hidden_layers=2, hidden_size=8, num_attention_heads=2)
    assert all(isinstance(x, PreallocatedLayer) for x in rollout_cache(full, 10).layers)
    sliding = LlamaConfig(num_hidden_layers=2, hidden_size=8, num_attention_heads=2)
    sliding.layer_types = ["sliding_attention", "full_attention"]
    sliding.sliding_window = 4
    kinds = [type(x) for x in rollout_cache(sliding, 10).layers]
    assert kinds[1] is PreallocatedLayer and kinds[0] is not PreallocatedLayer
