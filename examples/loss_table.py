"""Every GRPO-family surrogate variant on one seeded off-policy batch, as a table.

Shows how the knobs move the loss and its diagnostics: clipping, dual clip, GSPO's sequence
ratio, and the four reductions. Pure tensors; no model.
"""

from __future__ import annotations

import torch

from posttrain.algorithm.primitives.policy_gradient import (
    LOSS_TYPES,
    clipped_policy_gradient_loss,
    legacy_policy_gradient_loss,
    reduce_policy_gradient_loss,
)

MAX_LEN = 12


def seeded_batch(seed: int = 0, b: int = 8, t: int = MAX_LEN):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    old = logp + (torch.rand(b, t, generator=g, dtype=torch.float64) - 0.5) * 2.4
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    return logp, old, adv, mask


VARIANTS = [
    ("clipped token", dict(epsilon_low=0.2, epsilon_high=0.2)),
    ("clipped asym (0.2/0.28)", dict(epsilon_low=0.2, epsilon_high=0.28)),
    ("clipped dual (c=3)", dict(epsilon_low=0.2, epsilon_high=0.28, lower_bound_ratio=3.0)),
    (
        "GSPO sequence",
        dict(epsilon_low=3e-4, epsilon_high=4e-4, importance_sampling_level="sequence"),
    ),
]


def rows() -> list[tuple[str, str, float, dict[str, float]]]:
    logp, old, adv, mask = seeded_batch()
    out = []
    for name, kw in VARIANTS:
        per_tok, metrics = clipped_policy_gradient_loss(logp, old, adv, mask, **kw)
        for lt in LOSS_TYPES:
            num, w = reduce_policy_gradient_loss(per_tok, mask, lt, max_response_length=MAX_LEN)
            out.append((name, lt, (num / w).item(), {k: v.item() for k, v in metrics.items()}))
    legacy = legacy_policy_gradient_loss(logp, adv, mask)
    num, w = reduce_policy_gradient_loss(legacy, mask, "token-mean")
    out.append(("legacy_pg", "token-mean", (num / w).item(), {}))
    return out


def main() -> None:
    cols = [
        "clip_frac_low",
        "clip_frac_high",
        "dual_clip_frac",
        "ratio_mean",
        "approx_kl",
        "seq_clip_frac",
    ]
    head = f"{'variant':<24} {'loss_type':<26} {'loss':>9} " + " ".join(f"{c:>14}" for c in cols)
    print(head)
    print("-" * len(head))
    for name, lt, loss, m in rows():
        cells = " ".join(f"{m[c]:>14.4f}" if c in m else f"{'-':>14}" for c in cols)
        print(f"{name:<24} {lt:<26} {loss:>9.5f} {cells}")


if __name__ == "__main__":
    main()
