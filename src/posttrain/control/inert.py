"""Warned settings: honoured by the objective, but without effect (or dominated by numerics).

Each warning is returned once by :func:`posttrain.control.run_preflight`; the entry writes it to
the run log before training starts.
"""

from __future__ import annotations

from posttrain.algorithm.primitives.choices import LENGTH_WEIGHTED_LOSS_TYPES
from posttrain.config.schema import PosttrainConfig
from posttrain.control.reads import reads_or_none
from posttrain.control.rules import warning

#: An epsilon at or above this is token-scale: a mean-of-logs sequence ratio rarely moves so far.
TOKEN_SCALE_EPSILON = 1e-2


def _sequence_level(cfg: PosttrainConfig) -> bool:
    """The objective reads the ratio level (by its declaration) and it is ``sequence``."""
    reads = reads_or_none(cfg)
    level = reads is not None and reads.reads("rl.importance_sampling_level")
    return level and cfg.rl.importance_sampling_level == "sequence"


@warning("rl.importance_sampling_level", "rl.mini_batch_per_replica")
def sequence_level_on_policy_ratio(cfg: PosttrainConfig) -> str | None:
    """With one update per collected batch π_old equals π, the sequence ratio is exactly 1 and
    the clip never acts."""
    if not _sequence_level(cfg) or cfg.rl.mini_batch_per_replica != 1:
        return None
    return (
        "rl.importance_sampling_level=sequence with rl.mini_batch_per_replica=1: every update is "
        "on-policy, the sequence ratio is 1 and the clip never acts"
    )


@warning("rl.importance_sampling_level", "rl.epsilon_low", "rl.epsilon_high")
def sequence_level_token_scale_epsilons(cfg: PosttrainConfig) -> str | None:
    """A sequence ratio is the exponential of a mean token log-ratio and stays near 1, so
    token-scale epsilons (>= 1e-2) almost never clip; GSPO uses 3e-4/4e-4."""
    eps = max(cfg.rl.epsilon_low, cfg.rl.epsilon_high)
    if not _sequence_level(cfg) or eps < TOKEN_SCALE_EPSILON:
        return None
    return (
        f"rl.epsilon_low={cfg.rl.epsilon_low}, rl.epsilon_high={cfg.rl.epsilon_high} are "
        "token-scale at rl.importance_sampling_level=sequence and will rarely clip "
        "(GSPO uses 3e-4/4e-4)"
    )


@warning("rl.importance_sampling_level", "model.dtype")
def sequence_level_bf16_logprobs(cfg: PosttrainConfig) -> str | None:
    """bf16 logprob rounding can be as large as a sequence-level clip range, so clip decisions
    may follow numerics rather than policy change."""
    if not _sequence_level(cfg) or cfg.model.dtype != "bfloat16":
        return None
    return (
        "model.dtype=bfloat16 at rl.importance_sampling_level=sequence: bf16 logprob rounding "
        "is comparable to the sequence clip range"
    )


@warning("rl.importance_sampling_level", "rl.loss_type")
def sequence_level_length_weighting(cfg: PosttrainConfig) -> str | None:
    """Token-sum reductions weight each response by its length, while the sequence ratio is
    length-normalised; GSPO pairs it with seq-mean-token-mean."""
    if not _sequence_level(cfg) or cfg.rl.loss_type not in LENGTH_WEIGHTED_LOSS_TYPES:
        return None
    return (
        f"rl.loss_type={cfg.rl.loss_type} at rl.importance_sampling_level=sequence weights "
        "responses by length; GSPO uses seq-mean-token-mean"
    )


@warning("rl.dynamic_sampling", "rl.advantage_estimator")
def dynamic_sampling_batch_baseline(cfg: PosttrainConfig) -> str | None:
    """Dynamic sampling drops groups of equal rewards because a group baseline gives them zero
    advantage; under reinforce_pp's batch baseline those groups do carry signal."""
    if not cfg.rl.dynamic_sampling or cfg.rl.advantage_estimator != "reinforce_pp":
        return None
    return (
        "rl.dynamic_sampling=true with rl.advantage_estimator=reinforce_pp: groups of equal "
        "rewards are dropped although the batch baseline gives them non-zero advantages"
    )


@warning("rl.micro_batch_tokens", "rollout.max_tokens")
def token_budget_below_one_row(cfg: PosttrainConfig) -> str | None:
    """A row over rl.micro_batch_tokens runs alone, one forward per row (many times slower);
    a budget below one full-length response (rollout.max_tokens plus a prompt token) puts every
    such row alone. Where only the batch shows its rows, the run warns at its first step."""
    budget, response = cfg.rl.micro_batch_tokens, cfg.rollout.max_tokens
    if budget is None or budget > response:
        return None
    return (
        f"rl.micro_batch_tokens={budget} is below one row: a row forwards its prompt plus up to "
        f"rollout.max_tokens={response} response tokens, so each such row runs alone, one "
        f"forward per row; set rl.micro_batch_tokens to at least the longest prompt + {response}"
    )


RULES = (
    sequence_level_on_policy_ratio,
    sequence_level_token_scale_epsilons,
    sequence_level_bf16_logprobs,
    sequence_level_length_weighting,
    dynamic_sampling_batch_baseline,
    token_budget_below_one_row,
)
