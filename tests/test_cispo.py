"""CISPO (rl.grpo_surrogate=cispo): hand-computed loss and gradient, the detached weight, its
declared reads, and the conformance kit."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_llama

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import cfg  # noqa: E402

from posttrain.algorithm.grpo import make_objective  # noqa: E402
from posttrain.algorithm.primitives.policy_gradient import (  # noqa: E402
    LOSS_TYPES,
    cispo_policy_gradient_loss,
    clipped_policy_gradient_loss,
)
from posttrain.config.build import needs_reference, objective_reads  # noqa: E402
from posttrain.control import PreflightError, run_preflight  # noqa: E402
from posttrain.testing import check_objective, synthetic_batch  # noqa: E402

CISPO = ["rl.grpo_surrogate=cispo"]


def _inputs():
    """Two responses; ratios (1.5, 0.5, 1) with A=+1 and (2.0, 1.1, masked) with A=-2."""
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -0.7]], dtype=torch.float64)
    ratios = torch.tensor([[1.5, 0.5, 1.0], [2.0, 1.1, 1.0]], dtype=torch.float64)
    old = logp - ratios.log()
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    return logp.requires_grad_(), old, adv, mask


def test_loss_gradient_and_metrics_hand_computed():
    logp, old, adv, mask = _inputs()
    loss, metrics = cispo_policy_gradient_loss(logp, old, adv, mask, epsilon_high=0.28)
    # w = min(r, 1.28): (1.28, 0.5, 1.0), (1.28, 1.1, -); l = -w * A * logp
    expected = [[1.28 * 1.0, 0.5 * 2.0, 1.0 * 0.5], [-1.28 * 2 * 0.3, -1.1 * 2 * 1.2, 0.0]]
    torch.testing.assert_close(loss, torch.tensor(expected, dtype=torch.float64))
    loss.sum().backward()
    # the weight is detached: d l / d logp = -w * A, also where the weight was capped
    grad = [[-1.28, -0.5, -1.0], [2.56, 2.2, 0.0]]
    torch.testing.assert_close(logp.grad, torch.tensor(grad, dtype=torch.float64))
    assert metrics["clip_frac_high"].item() == pytest.approx(2 / 5)  # ratios 1.5 and 2.0
    assert metrics["clip_frac_low"].item() == 0.0
    assert metrics["ratio_max"].item() == pytest.approx(2.0)
    assert metrics["ratio_min"].item() == pytest.approx(0.5)
    assert metrics["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 1 + 2 + 1.1) / 5)
    kl = [r - 1 - math.log(r) for r in (1.5, 0.5, 1.0, 2.0, 1.1)]
    assert metrics["approx_kl"].item() == pytest.approx(sum(kl) / 5)


def test_capped_tokens_keep_their_gradient_where_ppo_clip_drops_it():
    logp, old, adv, mask = _inputs()
    clipped, _ = clipped_policy_gradient_loss(
        logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28
    )
    (g_ppo,) = torch.autograd.grad(clipped[0, 0], logp)
    assert g_ppo[0, 0].item() == 0.0  # ratio 1.5 > 1.28 with A > 0: PPO's clip cuts it
    cispo, _ = cispo_policy_gradient_loss(logp, old, adv, mask, epsilon_high=0.28)
    (g,) = torch.autograd.grad(cispo[0, 0], logp)
    assert g[0, 0].item() == pytest.approx(-1.28)


def test_on_policy_gradient_equals_the_clipped_surrogates():
    logp, _, adv, mask = _inputs()
    old = logp.detach()
    a, _ = cispo_policy_gradient_loss(logp, old, adv, mask, epsilon_high=0.28)
    b, _ = clipped_policy_gradient_loss(logp, old, adv, mask, epsilon_low=0.2, epsilon_high=0.28)
    (ga,) = torch.autograd.grad(a.sum(), logp)
    (gb,) = torch.autograd.grad(b.sum(), logp)
    torch.testing.assert_close(ga, gb)  # both -A * grad logp at ratio 1


def test_per_token_advantages_and_bad_epsilon():
    logp, old, _, mask = _inputs()
    adv = torch.tensor([[1.0, 0.0, 2.0], [1.0, -1.0, 5.0]], dtype=torch.float64)
    loss, _ = cispo_policy_gradient_loss(logp, old, adv, mask, epsilon_high=10.0)
    ratios = (logp.detach() - old).exp()
    torch.testing.assert_close(loss, torch.where(mask, -ratios * adv * logp.detach(), 0))
    with pytest.raises(ValueError, match="epsilon_high"):
        cispo_policy_gradient_loss(logp, old, adv, mask, epsilon_high=-1.0)


def _rl(**kw):
    base = dict(
        grpo_surrogate="cispo", importance_sampling_level="token", epsilon_low=0.2,
        epsilon_high=0.28, lower_bound_ratio=0.0, temperature=1.0, loss_type="token-mean",
        kl_beta=0.0, entropy_coef=0.0, kl_estimator="k3", rollout_is_cap=0.0,
    )  # fmt: skip
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_cispo_objective_conforms(loss_type):
    objective = make_objective(_rl(loss_type=loss_type), SimpleNamespace(max_response_length=6))
    check_objective(objective, lambda: tiny_llama(0), synthetic_batch(16, 6, dtype=torch.float64))


def test_cispo_with_kl_anchor_and_entropy_conforms():
    ctx = SimpleNamespace(max_response_length=6, reference_model=tiny_llama(1))
    objective = make_objective(_rl(kl_beta=0.1, entropy_coef=0.01, temperature=0.7), ctx)
    check_objective(objective, lambda: tiny_llama(0), synthetic_batch(16, 6, dtype=torch.float64))


def test_identity_records_what_cispo_reads():
    ident = make_objective(_rl(), SimpleNamespace(max_response_length=6)).identity
    assert ident["grpo_surrogate"] == "cispo" and ident["epsilon_high"] == 0.28
    assert "epsilon_low" not in ident and "lower_bound_ratio" not in ident


@pytest.mark.parametrize(
    ("opts", "fragment"),
    [(["rl.epsilon_low=0.1"], "rl.epsilon_low=0.1 is never read by rl.grpo_surrogate=cispo "
      "(its importance weight has no lower bound)"),
     (["rl.lower_bound_ratio=3"], "(no dual clip)"),
     (["rl.importance_sampling_level=sequence"], "(it weights each token)"),
     (["rollout.temperature=0.7"], "rl.grpo_surrogate=cispo scores at rl.temperature")],
)  # fmt: skip
def test_preflight_refuses_what_cispo_does_not_read(opts, fragment):
    with pytest.raises(PreflightError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        run_preflight(cfg([*CISPO, *opts]))


def test_preflight_accepts_cispo_knobs_and_builds_its_reference():
    opts = [*CISPO, "rl.epsilon_high=4", "rl.kl_beta=0.05", "rl.kl_estimator=k2",
            "rl.entropy_coef=0.01", "rl.loss_type=seq-mean-token-mean"]  # fmt: skip
    assert run_preflight(cfg(opts)) == []
    assert needs_reference(cfg(opts))
    assert not objective_reads(cfg(CISPO)).reads("rl.epsilon_low")
