"""On-policy distillation on arithmetic: a random student learns from the demo's GRPO policy.

Teacher: the final checkpoint of ``arithmetic_clipped`` (``make demo`` trains it; ``make demo-opd``
trains it first when it is missing). Student: the same freshly initialised ``arith`` model that
GRPO starts from (same directory, same seed), so the two runs differ only in the training signal.
Data and sampling follow ``arithmetic_clipped``; there is no KL anchor and no shaping reward: the
teacher's log-probs are the signal. The reward stage still scores every sample, so
``train/reward_accuracy`` and held-out accuracy are comparable with GRPO. The optimiser differs:

- weight decay 0.1 instead of 1.0: GRPO's strong decay regularises learning from a sparse reward
  and slows fitting a teacher's dense distribution (2026-12-07, students of seeds 0-2: 0.9 first
  at 225 / 300 / 300 steps against 325 / 375 / 450 with 1.0; with an AVX2 machine's kernels
  225 / 275 / 325 against 250 / 350 / 400; docs/guides/seeds.md);
- learning rate 3e-3 instead of 1e-3 (measured before 5d4b3a7: at 1e-3 the advantage mode reached
  0.65 held-out in 500 steps, at 3e-3 0.9 by step 375; the direct mode reached 0.9 at either).

The loss is the direct reverse KL over the whole next-token distribution
(``rl.distillation_mode=direct``; the 22-token vocabulary makes the default ``teacher.top_k``
exact), not the advantage mode's one-sample estimate of the same gradient: over students of seeds
0-2 with one teacher (docs/guides/seeds.md, before 5d4b3a7) the direct mode reached 0.9 held-out
on 3 of 3 (first at 325-375 steps), the advantage mode on 2 of 3 (seed 1 ended at 0.65).
``rl.distillation_mode=advantage`` is the sampled-token mode (no top-k traffic from the teacher).
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.arithmetic_clipped import build_config as build_grpo_config

#: Where ``make demo`` leaves the GRPO policy's last checkpoint (3000 steps, saved every 1000).
TEACHER_CHECKPOINT = "outputs/grpo/arithmetic_clipped/checkpoints/step_00003000/model"


def build_config() -> PosttrainConfig:
    cfg = build_grpo_config()
    cfg.job.name = "opd_arithmetic"
    cfg.job.algorithm = "opd"
    cfg.teacher.name_or_path = TEACHER_CHECKPOINT
    cfg.reward.functions = []
    cfg.reward.functions_anneal_steps = 0

    cfg.rl.distillation_mode = "direct"
    cfg.rl.kl_beta = 0.0
    cfg.rl.lr = 3e-3
    cfg.rl.weight_decay = 0.1
    cfg.rl.max_steps = 500
    cfg.rl.eval_every = 25
    cfg.rl.save_every = 250
    return cfg
