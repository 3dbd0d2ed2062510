"""A custom objective in ~40 lines: GRPO's surrogate plus an entropy-style bonus.

Train with it — no driver script; the working directory is importable::

    cd examples && posttrain grpo --objective custom_objective:build --config arithmetic_clipped

Or run this file (``python examples/custom_objective.py``): it builds a tiny model and prints one
loss. See docs/guides/objectives.md.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from posttrain.algorithm.grpo import make_objective
from posttrain.algorithm.primitives.objective import OBJECTIVE_WEIGHT_SUM, Objective
from posttrain.config.build import build_objective
from posttrain.data.logprobs import response_logprobs
from posttrain.data.trajectory import TrajectoryBatch

BONUS = 0.01


def with_logprob_bonus(base: Objective, coef: float = BONUS) -> Objective:
    """Add ``coef * mean(-logp)`` over response tokens, in the base objective's own unit.

    The base is TOKEN_SUM with a token weight (token-mean), so the bonus is written as a token
    sum divided by the same weight: chunks and ranks still combine exactly.
    """

    def fn(model, batch):
        loss, metrics = base.fn(model, batch)
        weight = metrics[OBJECTIVE_WEIGHT_SUM]
        logp = response_logprobs(model, batch)
        bonus_sum = (-logp).masked_fill(~batch.response_mask, 0).sum()
        bonus = coef * bonus_sum / weight if float(weight) > 0 else bonus_sum * 0
        metrics["logprob_bonus"] = bonus.detach()
        return loss - bonus, metrics

    return Objective(
        fn,
        base.reduction,
        base.metric_adapter.extended({"logprob_bonus": "custom/logprob_bonus"}),
        old_logp_cache=base.old_logp_cache,
        identity={**base.identity, "logprob_bonus": coef},
    )


def build(rl, context) -> Objective:
    """The builder ``--objective custom_objective:build`` names: the configured GRPO-family
    objective with the bonus on top (module level, so it travels to Ray workers by name)."""
    return with_logprob_bonus(build_objective(rl, context))


def demo_batch(seed: int = 0) -> TrajectoryBatch:
    g = torch.Generator().manual_seed(seed)
    b, p, r = 4, 3, 4
    ids = torch.randint(3, 32, (b, p + r), generator=g)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    attn = torch.cat([torch.ones(b, p, dtype=torch.long), mask.long()], dim=1)
    return TrajectoryBatch(
        input_ids=ids * attn,
        attention_mask=attn,
        response_mask=mask,
        group_ids=torch.tensor([0, 0, 1, 1]),
        sample_ids=torch.arange(b),
        advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]),
    )


def main() -> float:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    model = LlamaForCausalLM(cfg)
    rl = SimpleNamespace(
        grpo_surrogate="clipped", importance_sampling_level="token", epsilon_low=0.2,
        epsilon_high=0.28, lower_bound_ratio=0.0, temperature=1.0, loss_type="token-mean", kl_beta=0.0,
        kl_estimator="k3", entropy_coef=0.0,
        rollout_is_cap=0.0,
    )  # fmt: skip
    objective = with_logprob_bonus(make_objective(rl, SimpleNamespace(max_response_length=4)))
    batch = demo_batch()
    objective.old_logp_cache.capture(model, batch)
    loss, metrics = objective(model, batch)
    public = objective.metric_adapter.adapt(metrics)
    print(f"loss={loss.item():.6f} bonus={public['train/custom/logprob_bonus'].item():.6f}")
    return loss.item()


if __name__ == "__main__":
    main()
