"""Multi-turn sampling of a model with sliding-window layers: the window counts tokens, not cache
columns.

The continued cache has holes (left padding of each appended block, decode steps after a row
stopped), so a window over cache columns would see fewer of a row's tokens than the trainer's
forward over the trajectory does. The sampler masks by the tokens' positions instead; its
logprobs equal one unpadded forward per trajectory.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from multiturn_fixtures import build_sliding_tools_model, worst_sampler_gap

from posttrain.config import PosttrainConfig
from posttrain.data.logprobs import response_logprobs
from posttrain.data.tasks import TaskItem
from posttrain.model.loading import load_policy
from posttrain.placement.roles import RewardRole, RolloutRole
from posttrain.rollout.continuation import attention_windows
from posttrain.rollout.multiturn import multiturn_rollout


def test_sliding_window_logprobs_equal_a_full_sequence_recompute(tmp_path) -> None:
    model_dir = build_sliding_tools_model(tmp_path / "model", window=4)
    cfg = PosttrainConfig(
        model={"name_or_path": str(model_dir)}, rollout={"max_tokens": 6, "n": 2},
        env={"name": "role_fixtures:chatty", "max_turns": 3, "max_context": 120},
    )  # fmt: skip
    model, tok = load_policy(str(model_dir), None, "float32", "cpu")
    assert attention_windows(model.config) == {"sliding_attention": 4, "full_attention": None}
    roles = SimpleNamespace(reward=RewardRole(cfg), rollout=RolloutRole(cfg, model=model))
    items = [TaskItem(f"{a}+{a + 1}=", str(2 * a + 1)) for a in range(4)]
    b = multiturn_rollout(roles, items, tok, n=2, temperature=1.0, top_p=1.0, seed=0).batch
    lengths = b.response_mask.sum(-1)
    assert len(set(lengths.tolist())) > 1  # rows of different lengths: the cache has holes
    assert worst_sampler_gap(model, b) <= 1e-6  # one unpadded forward per trajectory
    with torch.no_grad():
        trained = response_logprobs(model, b)  # the trainer's padded forward reads the same
    m = b.response_mask
    assert (trained[m] - b.rollout_logprobs[m]).abs().max() <= 1e-6


def test_full_attention_models_have_no_windows() -> None:
    from transformers import LlamaConfig, MistralConfig

    assert attention_windows(LlamaConfig()) is None
    assert attention_windows(MistralConfig(sliding_window=None)) is None
    assert attention_windows(MistralConfig(sliding_window=8)) == {"all": 8}
