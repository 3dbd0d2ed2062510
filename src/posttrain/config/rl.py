"""The ``rl`` section: objective selection, its knobs, and the optimisation schedule.

Each field validates its own value, once, here. Which knobs an objective actually reads is each
objective's declaration (``posttrain.algorithm.primitives.reads``), checked by preflight.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from posttrain.algorithm.primitives.choices import (
    AdvantageEstimator,
    DivergenceKind,
    KLEstimator,
    LossType,
    RewardScaling,
)
from posttrain.config.base import Section
from posttrain.config.user_code import split_spec

#: ``rl.rollout_is_cap`` when the sampler is not the trainer's forward and the cap is left unset:
#: under ``rl.off_policy_lag >= 1`` every sample comes from older weights than the trainer's, and
#: ``rollout.engine=vllm`` samples with other kernels; either way the behaviour-policy correction
#: is on.
LAG_IS_CAP = 2.0


class RLConfig(Section):
    """The policy objective and its training schedule."""

    section_name = "rl"

    objective_builder: str | None = Field(
        None,
        description="Your objective builder, `module:function` (`build(rl, context) -> "
        "Objective`), imported from the working directory first; `--objective` sets it. Unset: "
        "the entry's built-in objective. It is part of the run's record: resume compares it.",
    )
    grpo_surrogate: Literal["clipped", "cispo", "legacy_pg"] = Field(
        "clipped",
        description="GRPO loss: `clipped` (importance ratio against a frozen π_old, epsilon "
        "and dual clip, loss temperature, configurable reduction), `cispo` (MiniMax-M1: "
        "-sg(min(ratio, 1 + epsilon_high))·A·log π, every token keeps its gradient) or "
        "`legacy_pg` (plain -A·log π, token mean; for toy runs and parity checks).",
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token",
        description="Granularity of the clipped ratio: one ratio per `token`, or one per "
        "response, the exponential of the mean token log-ratio (`sequence`, GSPO).",
    )
    epsilon_low: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Clip range below 1: the ratio is clipped at 1 - epsilon_low.",
    )
    epsilon_high: float = Field(
        0.2,
        gt=0,
        description="Clip range above 1: the ratio is clipped at 1 + epsilon_high. 0.2 is the "
        "symmetric PPO choice; 0.28 (clip-higher) is a common alternative for long runs.",
    )
    lower_bound_ratio: float = Field(
        0.0,
        ge=0,
        description="Dual clip for negative advantages: the per-token loss is capped at "
        "lower_bound_ratio·|A|. 0 disables it; otherwise it must be greater than 1.",
    )
    temperature: float = Field(
        1.0,
        gt=0,
        description="Temperature the loss scores logprobs at (`clipped` and `cispo`); must "
        "equal `rollout.temperature`.",
    )
    loss_type: LossType = Field(
        "token-mean",
        description="Reduction of per-token losses: `token-mean` (over all tokens), "
        "`seq-mean-token-mean` (mean of per-response means), `seq-mean-token-sum` (mean of "
        "per-response sums), `seq-mean-token-sum-fixed` (per-response sums divided by "
        "`rollout.max_tokens`, then the mean; Dr-GRPO).",
    )
    advantage_estimator: AdvantageEstimator = Field(
        "grpo",
        description="Advantage of a response, computed in the reward stage over complete groups: "
        "`grpo` (r - group mean, divided by the `rl.reward_scaling` std), `dr_grpo` (r - group "
        "mean, no division; Dr-GRPO), `rloo` (r - mean of the other group members, divided by "
        "the `rl.reward_scaling` std), `reinforce_pp` (r - batch mean, divided by the batch std; "
        "REINFORCE++).",
    )
    reward_scaling: RewardScaling = Field(
        "group",
        description="Std the `grpo` and `rloo` advantages are divided by: that of the response's "
        "`group`, of the whole `batch` (TRL's scale_rewards=batch), or `none` (rloo only; for "
        "grpo that is `rl.advantage_estimator=dr_grpo`). `dr_grpo` and `reinforce_pp` fix their "
        "own scaling and do not read it.",
    )
    credit: Literal["trajectory", "turn", "state"] = Field(
        "trajectory",
        description="What a policy token's advantage is computed from: `trajectory` (the "
        "whole score, one advantage per response), `turn` (multi-turn rollouts only: each "
        "turn's tokens get the group advantage of the reward earned from that turn on, the "
        "environment's reward of each turn plus the last turn's verifier and reward "
        "functions; the first turn's is the trajectory's) or `state` (as `turn`, but a later "
        "turn's baseline is only the group's rows that reached the same state, the same tokens "
        "before that turn, the estimator and scaling applied within it; a state one row alone "
        "reached gets advantage 0; not with `reinforce_pp`, whose baseline is the batch's).",
    )
    advantage_eps: float = Field(
        1e-6, gt=0, description="Added to the std before dividing the advantage by it."
    )
    kl_beta: float = Field(
        0.0,
        ge=0,
        description="Weight of the KL penalty to a frozen reference model; 0 builds no "
        "reference. `clipped` and `cispo` have a KL term, `legacy_pg` none.",
    )
    kl_estimator: KLEstimator = Field(
        "k3",
        description="Per-token estimator of KL(policy || reference) in the KL anchor, from "
        "policy samples with d = log ref - log policy (Schulman): `k1` = -d (unbiased, can be "
        "negative), `k2` = d^2/2 (biased, low variance), `k3` = exp(d) - 1 - d (unbiased, "
        ">= 0; GRPO's). Read only when `rl.kl_beta > 0`.",
    )
    reference_reset_every: int = Field(
        0,
        ge=0,
        description="Every N steps the KL reference becomes a frozen copy of the policy (after "
        "the update of each step s with s % N == 0; ProRL's reference reset, TRL's "
        "`sync_ref_model`); 0 keeps the initial model. Read only when `rl.kl_beta > 0`. The "
        "reference then scores on the policy side, also under a lag (docs/guides/objectives.md).",
    )
    reset_optimizer: bool = Field(
        False,
        description="At each reference reset also clear the optimizer's state (AdamW moments and "
        "step counts; the learning-rate schedule goes on). Read only when "
        "`rl.reference_reset_every > 0`.",
    )
    entropy_coef: float = Field(
        0.0,
        ge=0,
        description="Entropy bonus of the clipped surrogate: the loss subtracts entropy_coef x "
        "the policy's per-token entropy (at `rl.temperature`, reduced like the policy loss by "
        "`rl.loss_type`). 0 adds no term; the entropy is reported as a metric either way.",
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO dynamic sampling: drop groups whose rewards are all equal (no signal) "
        "and keep sampling `data.prompts_per_step` fresh prompts per round until the step has "
        "that many informative groups or `rl.max_sampling_rounds` rounds ran; a shortfall is "
        "reported as `train/sampling/shortfall_groups`.",
    )
    max_sampling_rounds: int = Field(
        3,
        ge=1,
        description="Most sampling rounds per step with `rl.dynamic_sampling` (each round draws "
        "`data.prompts_per_step` prompts from the data cursor).",
    )
    lr: float = Field(1e-6, gt=0, description="Peak learning rate (see `rl.lr_schedule`).")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant",
        description="Learning rate over the run's optimizer steps (`rl.max_steps` x "
        "`rl.mini_batch_per_replica`): constant after warmup, or a linear / cosine decay to 0.",
    )
    warmup_steps: int = Field(
        0, ge=0, description="Optimizer steps of linear warmup from 0 up to `rl.lr`."
    )
    weight_decay: float = Field(
        0.0, ge=0, description="Weight decay given to the optimizer (decoupled in AdamW)."
    )
    optimizer: Literal["adamw", "sgd"] = Field("adamw", description="Policy optimizer.")
    adam_beta1: float = Field(
        0.9, ge=0, lt=1, description="AdamW first-moment decay (read when rl.optimizer=adamw)."
    )
    adam_beta2: float = Field(
        0.999,
        ge=0,
        lt=1,
        description="AdamW second-moment decay; lower (0.99) adapts faster to the shifting "
        "gradient scale of RL from scratch.",
    )
    max_steps: int = Field(200, ge=1, description="Number of optimizer steps to train.")
    save_every: int = Field(
        50, ge=0, description="Checkpoint every this many steps; 0 saves only at the end."
    )
    eval_every: int = Field(
        25, ge=0, description="Validate every this many steps; 0 disables validation."
    )
    resume: Literal["auto", "off", "must"] = Field(
        "auto",
        description="`auto` resumes from the run directory's latest checkpoint if one exists, "
        "`off` starts fresh, `must` fails when no checkpoint exists.",
    )
    mini_batch_per_replica: int = Field(
        1,
        ge=1,
        description="Optimizer updates per collected batch on each policy replica; above 1 "
        "the later updates are off-policy and the ratio against π_old matters.",
    )
    micro_batch_size: int = Field(
        4,
        ge=1,
        description="Responses per forward/backward chunk; changes memory, never the gradient.",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Token budget of an update's forward/backward chunk, replacing "
        "`rl.micro_batch_size` there: rows are sorted by length and packed while rows x (longest "
        "prompt + longest response) stays within it (whole groups where `rl.shared_prefix` "
        "shares; a row over the budget runs alone). Bounds activation memory and keeps padding "
        "small (`train/padding_fraction`); exact for TOKEN_SUM objectives. Unset: row chunks.",
    )
    shared_prefix: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Encode each distinct prompt of a micro-batch once and run its responses "
        "against that prompt's keys and values, in the policy, reference, π_old and teacher "
        "forwards (exact to rounding; the rollout always prefills each prompt once). `auto` "
        "shares where the model supports it and logs once why not elsewhere, `on` fails there, "
        "`off` encodes every row's prompt.",
    )
    grad_clip: float = Field(
        1.0, ge=0, description="Clip the global gradient norm to this value; 0 disables it."
    )
    max_consecutive_nonfinite: int = Field(
        3,
        ge=1,
        description="Steps with a non-finite loss or gradient are skipped; after this many in a "
        "row the run stops. 1 stops on the first.",
    )
    rollout_is_cap: float = Field(
        0.0,
        ge=0,
        description="Truncated importance-sampling correction for the sampler-trainer gap "
        "(`clipped`, `cispo` and OPD's `advantage` mode): each token's policy-gradient term is weighted by "
        "min(π_old / π_rollout, cap). 0 turns it off. Matters when the rollout samples with "
        "other weights than the trainer scores with (`rollout.dtype`, `rl.off_policy_lag`). "
        "Default: 0, or 2.0 when `rl.off_policy_lag >= 1` or `rollout.engine=vllm`.",
    )
    off_policy_lag: int = Field(
        0,
        ge=0,
        description="Steps the rollout runs ahead of the policy: the batch trained at step s "
        "is sampled with the weights after step s-1-k (the initial weights while that is < 1), "
        "so sampling the next k batches overlaps the current update (`placement.backend=ray`). "
        "A pure function of the step, never of timing: runs replay and resume bit for bit. 0 "
        "is the sequential loop. See docs/guides/async.md.",
    )
    distillation_mode: Literal["advantage", "direct"] = Field(
        "advantage",
        description="OPD only: `advantage` uses the teacher-student log-ratio as a per-token "
        "advantage; `direct` minimises a divergence to the teacher.",
    )
    divergence: DivergenceKind = Field(
        "reverse_kl",
        description="OPD direct mode only: the divergence between the student's and the "
        "teacher's next-token distributions: `reverse_kl` KL(student‖teacher) (mode seeking), "
        "`forward_kl` KL(teacher‖student) (mass covering), or `jsd`, the generalised "
        "Jensen-Shannon divergence with weight `rl.jsd_beta`.",
    )
    jsd_beta: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="OPD `rl.divergence=jsd` only: β of JSD(β) = β·KL(p‖m) + (1-β)·KL(q‖m), "
        "m = β·p + (1-β)·q, p the teacher, q the student.",
    )

    @field_validator(
        "epsilon_low",
        "epsilon_high",
        "lower_bound_ratio",
        "temperature",
        "advantage_eps",
        "kl_beta",
        "entropy_coef",
        "lr",
        "weight_decay",
        "grad_clip",
        "rollout_is_cap",
    )
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be finite")
        return value

    #: Whether the rollout samples with another engine than the trainer's forward (set by the
    #: whole config, which knows ``rollout.engine``: :meth:`resolve_is_cap`).
    _sampler_apart: bool = PrivateAttr(False)

    @model_validator(mode="after")
    def _state_credit_needs_a_group_baseline(self) -> RLConfig:
        if self.credit == "state" and self.advantage_estimator == "reinforce_pp":
            raise ValueError(
                "rl.credit=state judges a turn against the rows in its state, a group "
                "baseline; rl.advantage_estimator=reinforce_pp's is the batch's: use grpo, "
                "rloo or dr_grpo, or rl.credit=turn"
            )
        return self

    @model_validator(mode="after")
    def _lag_turns_is_correction_on(self) -> RLConfig:
        self._settle_is_cap()
        return self

    def resolve_is_cap(self, sampler_apart: bool) -> None:
        """Settle the cap's default once the engine is known (``PosttrainConfig.resolved``)."""
        self._sampler_apart = sampler_apart
        self._settle_is_cap()

    def _auto_is_cap(self) -> float:
        apart = getattr(self, "_sampler_apart", False)  # unset while pydantic builds the model
        return LAG_IS_CAP if self.off_policy_lag or apart else 0.0

    def _settle_is_cap(self) -> None:
        # The cap's default depends on the lag and the engine; a value the user set (fields_set)
        # is kept. The write bypasses assignment validation, which would re-enter the validator.
        if "rollout_is_cap" not in self.model_fields_set:
            self.__dict__["rollout_is_cap"] = self._auto_is_cap()

    def is_default(self, name: str) -> bool:
        if name == "rollout_is_cap":  # under a lag or vLLM both the schema's 0 and the cap
            return self.rollout_is_cap in (self.default_of(name), self._auto_is_cap())  # are
        return super().is_default(name)  # defaults: no claim

    @field_validator("objective_builder")
    @classmethod
    def _check_builder_spec(cls, value: str | None) -> str | None:
        if value is None:
            return None
        module, attr = split_spec(value, ValueError)
        return f"{module}:{attr}"

    @field_validator("lower_bound_ratio")
    @classmethod
    def _check_dual_clip(cls, value: float) -> float:
        if 0 < value <= 1:
            raise ValueError("must be 0 (dual clip off) or greater than 1")
        return value
