"""Diffusion objectives: the plain denoising loss and Diffusion-DPO (Wallace et al., 2023).

Both take a row's timestep and noise from the row's own seed (:func:`row_noise`), so the loss
of a row never depends on which other rows share its micro-batch or rank, and a resumed run
draws exactly what the uninterrupted one would have drawn.

Notation: ε-prediction DDPM with T training timesteps and cumulative signal ᾱ_t;
x_t = √ᾱ_t·x_0 + √(1-ᾱ_t)·ε; for a network f, the denoising error of an image x at (t, ε, c) is
``e_f(x) = mean over channels and pixels of (ε - f(x_t, t, c))²``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posttrain.algorithm.primitives.objective import MetricAdapter, Objective, Reduction
from posttrain.data.images import ImageBatch, PairBatch


def row_noise(
    seeds: Tensor, shape: tuple[int, ...], num_timesteps: int, dtype: torch.dtype, low: int = 0
) -> tuple[Tensor, Tensor]:
    """(t [B] int64 in ``low..num_timesteps-1``, ε [B, *shape]) from one CPU generator per seed.

    Drawn on the CPU in float32 and then cast, so the same seed gives the same t and ε on every
    device and in every precision.
    """
    ts, eps = [], []
    for seed in seeds.tolist():
        g = torch.Generator().manual_seed(int(seed))
        ts.append(torch.randint(low, num_timesteps, (1,), generator=g))
        eps.append(torch.randn(shape, generator=g))
    device = seeds.device
    return torch.cat(ts).to(device), torch.stack(eps).to(device=device, dtype=dtype)


def denoising_errors(
    model: nn.Module, x0: Tensor, labels: Tensor, t: Tensor, eps: Tensor, alphas_cumprod: Tensor
) -> Tensor:
    """Per-row e_f(x0): mean squared error of the predicted noise at (t, ε, labels)."""
    a = alphas_cumprod.to(device=x0.device, dtype=x0.dtype)[t].view(-1, 1, 1, 1)
    x_t = a.sqrt() * x0 + (1 - a).sqrt() * eps
    out = model(x_t, t, class_labels=labels)
    pred = getattr(out, "sample", out).to(x0.dtype)
    return (pred - eps).pow(2).mean(dim=(1, 2, 3))


class DiffusionReferenceScorer:
    """Denoising errors of a frozen reference on both images of each pair, at the pair's own
    (t, ε). The entry builds the network; the trainer places it as an auxiliary model."""

    def __init__(self, module: nn.Module, alphas_cumprod: Tensor, min_timestep: int = 0) -> None:
        self.module = module
        self.alphas_cumprod = alphas_cumprod
        self.min_timestep = min_timestep

    @torch.no_grad()
    def __call__(self, batch: PairBatch) -> Tensor:
        """``[B, 2]``: columns e_ref(chosen), e_ref(rejected), on the batch's device."""
        device = next(self.module.parameters()).device
        b = batch.to(device)
        t, eps = row_noise(
            b.seeds,
            tuple(b.chosen.shape[1:]),
            len(self.alphas_cumprod),
            b.chosen.dtype,
            self.min_timestep,
        )
        errs = denoising_errors(
            self.module,
            torch.cat([b.chosen, b.rejected]),
            torch.cat([b.labels, b.labels]),
            torch.cat([t, t]),
            torch.cat([eps, eps]),
            self.alphas_cumprod,
        )
        return errs.view(2, -1).T.to(batch.chosen.device)


def dpo_logits(
    model_w: Tensor, model_l: Tensor, ref_w: Tensor, ref_l: Tensor, beta: float, T: int
) -> Tensor:
    """Per pair ``-β·T/2·[(e_θ^w - e_ref^w) - (e_θ^l - e_ref^l)]`` (the implicit reward margin)."""
    return -0.5 * beta * T * ((model_w - ref_w) - (model_l - ref_l))


def make_dpo_objective(
    reference: DiffusionReferenceScorer, *, beta: float, alphas_cumprod: Tensor
) -> Objective:  # the reference's min_timestep sets the weighting (see below)
    """Diffusion-DPO, MEAN over pairs.

    For a pair (x^w, x^l) under condition c, one t ~ U{0..T-1} and one ε ~ N(0, I) shared by
    both images (drawn from the pair's seed)::

        loss = -log σ( -β·T·ω(λ_t)·½·[(e_θ^w - e_ref^w) - (e_θ^l - e_ref^l)] )

    with the weighting ω(λ_t) = 1 for t >= t_min and 0 below (t drawn from U{t_min..T-1};
    t_min = ``reference.min_timestep``, 0 by default: the paper's ω = 1 for every t) and e the
    per-pixel *mean* squared error (the paper's code; its equation uses the squared norm, a
    constant factor C·H·W that β absorbs). T is ``len(alphas_cumprod)``; the paper's β = 5000
    for Stable Diffusion corresponds here to β·T. The loss is a mean over pairs.
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    T = len(alphas_cumprod)
    low = reference.min_timestep
    if not 0 <= low < T:
        raise ValueError(f"min_timestep must be in 0..{T - 1}, got {low}")

    def fn(model: nn.Module, batch: PairBatch) -> tuple[Tensor, dict[str, Tensor]]:
        t, eps = row_noise(batch.seeds, tuple(batch.chosen.shape[1:]), T, batch.chosen.dtype, low)
        errs = denoising_errors(
            model,
            torch.cat([batch.chosen, batch.rejected]),
            torch.cat([batch.labels, batch.labels]),
            torch.cat([t, t]),
            torch.cat([eps, eps]),
            alphas_cumprod,
        )
        model_w, model_l = errs.view(2, -1)
        ref = reference(batch).to(errs.dtype)
        ref_w, ref_l = ref[:, 0], ref[:, 1]
        logits = dpo_logits(model_w, model_l, ref_w, ref_l, beta, T)
        loss = -F.logsigmoid(logits).mean()
        metrics = {
            "implicit_accuracy": (logits > 0).to(errs.dtype).mean().detach(),
            "reward_margin": logits.mean().detach(),
            "model_err_chosen": model_w.mean().detach(),
            "model_err_rejected": model_l.mean().detach(),
            "ref_err_chosen": ref_w.mean(),
            "ref_err_rejected": ref_l.mean(),
        }
        return loss, metrics

    adapter = MetricAdapter(
        {name: f"dpo/{name}" for name in _DPO_METRICS},
        reductions=dict.fromkeys(_DPO_METRICS, "mean"),  # per-pair means: equal chunks, exact
    )
    identity: dict[str, Any] = {
        "algorithm": "diffusion_dpo",
        "beta": beta,
        "num_train_timesteps": T,
        "weighting": "constant" if low == 0 else f"constant for t >= {low}, else 0",
    }
    return Objective(fn, Reduction.MEAN, adapter, identity=identity)


_DPO_METRICS = (
    "implicit_accuracy",
    "reward_margin",
    "model_err_chosen",
    "model_err_rejected",
    "ref_err_chosen",
    "ref_err_rejected",
)


def make_denoising_objective(*, alphas_cumprod: Tensor) -> Objective:
    """The DDPM training loss: mean over rows of e_θ(x) at the row's (t, ε). It pretrains a base
    model and, on the chosen images of pairs, is the fine-tune-on-winners baseline."""
    T = len(alphas_cumprod)

    def fn(model: nn.Module, batch: ImageBatch | PairBatch) -> tuple[Tensor, dict[str, Tensor]]:
        if isinstance(batch, PairBatch):
            batch = batch.winners()
        t, eps = row_noise(batch.seeds, tuple(batch.images.shape[1:]), T, batch.images.dtype)
        errs = denoising_errors(model, batch.images, batch.labels, t, eps, alphas_cumprod)
        return errs.mean(), {}

    identity = {"algorithm": "denoise", "num_train_timesteps": T}
    return Objective(fn, Reduction.MEAN, MetricAdapter(), identity=identity)
