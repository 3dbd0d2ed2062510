"""Seeded DDIM sampling (eta 0 and 1) and the pretraining weight average."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from posttrain.entrypoints.dpo_tools import update_ema
from posttrain.model.diffusion import build_tiny_unet, new_scheduler, sample


@pytest.fixture(scope="module")
def unet():
    return build_tiny_unet(8, 3, seed=0, channels=(8, 16))


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_a_sample_depends_on_its_own_seed_alone(unet, eta):
    scheduler = new_scheduler(50)
    labels, seeds = torch.tensor([0, 1, 2]), [11, 12, 13]
    together = sample(unet, scheduler, labels, seeds, steps=3, eta=eta)
    one_by_one = sample(unet, scheduler, labels, seeds, steps=3, eta=eta, batch=1)
    alone = sample(unet, scheduler, labels[1:2], seeds[1:2], steps=3, eta=eta)
    # Same noise for each sample; batched kernels may round differently (~1e-6), nothing more.
    torch.testing.assert_close(together, one_by_one, rtol=0, atol=1e-5)
    torch.testing.assert_close(together[1:2], alone, rtol=0, atol=1e-5)


def test_eta_adds_noise_per_step_and_is_checked(unet):
    scheduler, labels = new_scheduler(50), torch.tensor([0, 1])
    deterministic = sample(unet, scheduler, labels, [5, 6], steps=3, eta=0.0)
    stochastic = sample(unet, scheduler, labels, [5, 6], steps=3, eta=1.0)
    assert not torch.equal(deterministic, stochastic)
    with pytest.raises(ValueError, match="eta must be in"):
        sample(unet, scheduler, labels, [5, 6], steps=3, eta=1.5)


def test_update_ema_hand_computed():
    model, ema = nn.BatchNorm1d(2), nn.BatchNorm1d(2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([3.0, -1.0]))
        ema.weight.copy_(torch.tensor([1.0, 1.0]))
    model.num_batches_tracked.fill_(7)
    update_ema(ema, model, decay=0.75)
    assert torch.equal(ema.weight, torch.tensor([1.5, 0.5]))  # 0.75·1 + 0.25·3, 0.75·1 - 0.25
    assert int(ema.num_batches_tracked) == 7  # integer buffers are copied, not averaged
