"""Every built-in objective passes the conformance kit users run on their own objectives."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_llama

from posttrain.algorithm.grpo import make_objective
from posttrain.algorithm.primitives.policy_gradient import LOSS_TYPES
from posttrain.testing import check_objective, synthetic_batch


def _rl(**kw):
    base = dict(
        grpo_surrogate="clipped", importance_sampling_level="token", epsilon_low=0.2,
        epsilon_high=0.28, lower_bound_ratio=0.0, temperature=1.0, loss_type="token-mean",
        kl_beta=0.0, entropy_coef=0.0,
        kl_estimator="k3",
        rollout_is_cap=0.0,
    )  # fmt: skip
    base.update(kw)
    return SimpleNamespace(**base)


CASES = [
    *({"loss_type": lt} for lt in LOSS_TYPES),
    *({"loss_type": lt, "importance_sampling_level": "sequence"} for lt in LOSS_TYPES),
    {"lower_bound_ratio": 3.0, "temperature": 0.7},
    {"grpo_surrogate": "legacy_pg"},
    {"entropy_coef": 0.05, "loss_type": "seq-mean-token-mean"},
]


@pytest.mark.parametrize("knobs", CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_builtin_grpo_objectives_conform(knobs):
    objective = make_objective(_rl(**knobs), SimpleNamespace(max_response_length=6))
    batch = synthetic_batch(16, 6, dtype=torch.float64)
    report = check_objective(objective, lambda: tiny_llama(0), batch)
    assert report is not None


def test_kl_anchored_objective_conforms():
    ctx = SimpleNamespace(max_response_length=6, reference_model=tiny_llama(1))
    objective = make_objective(_rl(kl_beta=0.1), ctx)
    check_objective(objective, lambda: tiny_llama(0), synthetic_batch(16, 6, dtype=torch.float64))
