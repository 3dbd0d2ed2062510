"""Next-token sampling with temperature and nucleus (top-p) truncation.

The returned logprob is that of the distribution the token was actually drawn from:
``log_softmax(logits / temperature)``, restricted to the top-p nucleus and renormalised when
``top_p < 1``. At ``top_p == 1`` it equals what ``data.logprobs.token_logprobs`` recomputes with the
same temperature. ``temperature == 0`` means greedy decoding: the sampling distribution is a
point mass, so the reported logprob is exactly 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_sampling_args(temperature: float, top_p: float) -> None:
    if isinstance(temperature, bool) or not temperature >= 0:
        raise ValueError(f"rollout.temperature must be >= 0 (0 = greedy), got {temperature!r}")
    if isinstance(top_p, bool) or not 0 < top_p <= 1:
        raise ValueError(f"rollout.top_p must be in (0, 1], got {top_p!r}")


def sampling_logprobs(logits: Tensor, temperature: float, top_p: float = 1.0) -> Tensor:
    """``[..., V]`` log-probabilities of the sampling distribution (-inf outside the nucleus).

    The nucleus is the smallest set of most-likely tokens whose probability reaches ``top_p``
    (ties broken by the sort); the top token is always kept.
    """
    if temperature <= 0:
        raise ValueError("sampling_logprobs needs temperature > 0; greedy has a point mass")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logp = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()
    drop_sorted = mass_before >= top_p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    kept = logp.masked_fill(drop, float("-inf"))
    return kept - torch.logsumexp(kept, dim=-1, keepdim=True)


def sample_tokens(
    logits: Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Draw one token per row of ``logits [b, V]``; returns ``(tokens [b], logprobs [b])``.

    Uses the exponential race (argmax of p / E with E ~ Exp(1)), which samples exactly from p and
    needs one random tensor instead of a cumulative search per row.
    """
    if temperature == 0:
        tokens = logits.argmax(-1)
        lp_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        return tokens, torch.zeros(tokens.shape, dtype=lp_dtype, device=logits.device)
    logp = sampling_logprobs(logits, temperature, top_p)
    # E = -log(U) with U ~ U[0, 1): several times faster on CPU than Tensor.exponential_.
    race = torch.rand(logp.shape, dtype=logp.dtype, device=logp.device, generator=generator)
    race = race.log_().neg_().clamp_(min=torch.finfo(race.dtype).tiny)  # E=0 would give 0/0=nan
    tokens = (logp.exp() / race).argmax(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
