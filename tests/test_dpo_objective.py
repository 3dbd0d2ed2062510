"""Diffusion-DPO and the denoising loss against hand-computed values, and the contract."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from posttrain.algorithm.dpo import (
    DiffusionReferenceScorer,
    dpo_logits,
    make_denoising_objective,
    make_dpo_objective,
    row_noise,
)
from posttrain.data.images import ImageBatch, PairBatch, step_seeds
from posttrain.model.diffusion import alphas_cumprod as schedule_of
from posttrain.model.diffusion import build_tiny_unet, new_scheduler
from posttrain.testing import check_objective


class Scaled(nn.Module):
    """f(x_t, t, c) = w·x_t + b: a model whose denoising error is easy to write down."""

    def __init__(self, w: float, b: float = 0.0) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w, dtype=torch.float64))
        self.b = nn.Parameter(torch.tensor(b, dtype=torch.float64))

    def forward(self, x, t, class_labels=None):
        return self.w * x + self.b


def _pairs(n: int, size: int = 4, seed: int = 0, dtype=torch.float64) -> PairBatch:
    g = torch.Generator().manual_seed(seed)
    return PairBatch(
        chosen=(torch.rand(n, 3, size, size, generator=g) * 2 - 1).to(dtype),
        rejected=(torch.rand(n, 3, size, size, generator=g) * 2 - 1).to(dtype),
        labels=torch.randint(0, 3, (n,), generator=g),
        seeds=step_seeds(seed, 1, n),
    )


ALPHAS = torch.linspace(0.999, 0.01, 50, dtype=torch.float64)


def test_logits_hand_computed():
    # -0.5 * 0.01 * 1000 * ((0.1 - 0.2) - (0.3 - 0.2)) = -5 * -0.2 = 1.0
    z = dpo_logits(*(torch.tensor([v]) for v in (0.1, 0.3, 0.2, 0.2)), beta=0.01, T=1000)
    assert z.item() == pytest.approx(1.0)
    assert -torch.nn.functional.logsigmoid(z).item() == pytest.approx(math.log1p(math.exp(-1)))


def test_loss_hand_computed_with_a_linear_model():
    batch = _pairs(3)
    beta, T = 0.02, len(ALPHAS)
    policy, ref = Scaled(0.3, 0.1), Scaled(0.0)
    objective = make_dpo_objective(
        DiffusionReferenceScorer(ref, ALPHAS), beta=beta, alphas_cumprod=ALPHAS
    )
    loss, metrics = objective(policy, batch)
    expected, acc = [], []
    for i in range(3):
        g = torch.Generator().manual_seed(int(batch.seeds[i]))
        t = int(torch.randint(0, T, (1,), generator=g))
        eps = torch.randn(3, 4, 4, generator=g).double()
        a = float(ALPHAS[t])
        errs = []
        for x0 in (batch.chosen[i], batch.rejected[i]):
            x_t = math.sqrt(a) * x0 + math.sqrt(1 - a) * eps
            errs.append(((0.3 * x_t + 0.1 - eps) ** 2).mean().item())
            errs.append((eps**2).mean().item())  # the reference predicts 0
        (mw, rw, ml, rl) = errs
        z = -0.5 * beta * T * ((mw - rw) - (ml - rl))
        expected.append(math.log1p(math.exp(-z)))
        acc.append(z > 0)
    assert loss.item() == pytest.approx(sum(expected) / 3, rel=1e-12)
    assert metrics["implicit_accuracy"].item() == pytest.approx(sum(acc) / 3)


def test_model_that_ignores_the_image_gives_log2():
    """Chosen and rejected share t and ε, so a model blind to x has equal errors on both."""
    batch = _pairs(4)
    obj = make_dpo_objective(
        DiffusionReferenceScorer(Scaled(0.0, 0.7), ALPHAS), beta=5.0, alphas_cumprod=ALPHAS
    )
    loss, metrics = obj(Scaled(0.0, -0.4), batch)
    assert loss.item() == pytest.approx(math.log(2), abs=1e-12)
    assert metrics["reward_margin"].item() == pytest.approx(0.0, abs=1e-12)


def test_policy_equal_to_reference_gives_log2_and_a_gradient():
    unet = build_tiny_unet(8, 3, seed=0, channels=(8, 16)).double()
    obj = make_dpo_objective(
        DiffusionReferenceScorer(copy.deepcopy(unet), ALPHAS), beta=5.0, alphas_cumprod=ALPHAS
    )
    loss, metrics = obj(unet, _pairs(4, size=8))
    assert loss.item() == pytest.approx(math.log(2), abs=1e-9)
    assert metrics["implicit_accuracy"].item() == 0.0
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in unet.parameters())


def test_row_noise_is_a_function_of_the_seed_alone():
    seeds = torch.tensor([5, 9, 5])
    t, eps = row_noise(seeds, (3, 2, 2), 100, torch.float64)
    assert t[0] == t[2] and torch.equal(eps[0], eps[2])
    t1, eps1 = row_noise(seeds[1:2], (3, 2, 2), 100, torch.float64)
    assert t1[0] == t[1] and torch.equal(eps1[0], eps[1])


def test_conformance_kit_passes_on_a_tiny_unet():
    unet = build_tiny_unet(8, 3, seed=1, channels=(8, 16)).double()
    ref = copy.deepcopy(unet)
    with torch.no_grad():  # a reference that differs from the policy: margins are not zero
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    alphas = schedule_of(new_scheduler(100))
    obj = make_dpo_objective(DiffusionReferenceScorer(ref, alphas), beta=5.0, alphas_cumprod=alphas)
    report = check_objective(obj, unet, _pairs(6, size=8))
    assert report.splits == (2, 3)
    denoise = make_denoising_objective(alphas_cumprod=alphas)
    check_objective(denoise, unet, _pairs(6, size=8).winners())


def test_denoising_loss_hand_computed():
    batch = _pairs(2).winners()
    loss, _ = make_denoising_objective(alphas_cumprod=ALPHAS)(Scaled(0.0, 0.25), batch)
    expected = []
    for s in batch.seeds.tolist():
        g = torch.Generator().manual_seed(s)
        torch.randint(0, len(ALPHAS), (1,), generator=g)
        eps = torch.randn(3, 4, 4, generator=g).double()
        expected.append(((eps - 0.25) ** 2).mean().item())
    assert loss.item() == pytest.approx(sum(expected) / 2, rel=1e-12)


def test_denoising_on_pairs_trains_on_the_chosen_images():
    pairs = _pairs(3)
    obj = make_denoising_objective(alphas_cumprod=ALPHAS)
    model = Scaled(0.5)
    assert obj(model, pairs)[0].item() == obj(model, pairs.winners())[0].item()
    assert isinstance(pairs.winners(), ImageBatch)


def test_min_timestep_restricts_the_draw_and_enters_the_identity():
    seeds = step_seeds(0, 1, 64)
    t, _ = row_noise(seeds, (3, 2, 2), 50, torch.float64, low=30)
    assert int(t.min()) >= 30 and int(t.max()) <= 49
    ref = DiffusionReferenceScorer(Scaled(0.0), ALPHAS, min_timestep=30)
    obj = make_dpo_objective(ref, beta=1.0, alphas_cumprod=ALPHAS)
    assert obj.identity["weighting"] == "constant for t >= 30, else 0"
    with pytest.raises(ValueError, match="min_timestep must be in 0..49"):
        make_dpo_objective(
            DiffusionReferenceScorer(Scaled(0.0), ALPHAS, min_timestep=50),
            beta=1.0,
            alphas_cumprod=ALPHAS,
        )
