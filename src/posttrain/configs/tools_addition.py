"""Three-digit addition with the calculator: the base of `make demo-tools`, and the call.

A 135k-parameter Mistral (preset ``arith_tools``: Llama layers that attend to the last 10
tokens; the arithmetic alphabet, the roles of the tools chat template and the tool-call markers
as single tokens) starts from random weights. Adding two three-digit numbers is out of its reach
in the step budget; with the calculator it is a copy task. The environment
(``posttrain.env.arithmetic``) binds the operands to the names ``A`` and ``U``, so the right call
is the same for every problem, ``<tool_call>A+U</tool_call>`` (the compact call form), and what
is left is copying the tool's result (right-aligned to four characters) into the answer. Nothing
tells the model about the tool; it is found by reward alone:

- the environment pays up to 1.0 for the first call (opening it, closing it and ending the
  turn there, a right result, or part of ``A+U``'s characters for a wrong one) and, after a
  right call, up to 1.0 for the answer's copy of the result, character by character: a term of
  the score next to the verifier's (``train/reward_env_mean``); the exact verifier pays 1 for a
  right answer;
- the KL anchor to the random init at half ``arithmetic_clipped``'s weight (0.05), a constant
  learning rate, weight decay 0.1 (``arithmetic_clipped``'s 1.0 slowed the copy: measured with
  ``benchmarks/copy_probe.py``), 16 samples per prompt and otherwise ``arithmetic_clipped``'s
  optimiser.

In these 600 steps the policy learns the call (right on ~87% of samples from step 300) and the
answer gets as far as its first character; anchored to the random init, the copy does not take
off in 1,200 steps (docs/guides/tools.md). ``make demo-tools`` runs ``tools_addition_reset``:
this recipe for 2,000 steps with the KL anchor reset to the policy every 600 and per-state
credit. ``tools_addition_stage2`` (600 more steps from this run's final model, so its KL anchor
is this policy) is the two-stage chain the demo was until 2026-12-06.

``tools_addition_notool`` is this recipe without the environment (single-turn answers, the same
model, steps and optimiser), with ``digit_match`` paying for partly right digits in its place,
the baseline of the chain (and ``tools_addition_notool_stage2`` its stage 2);
``tools_addition_notool_reset`` is the demo's.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.arithmetic_clipped import build_config as build_clipped_config
from posttrain.run.records import final_model_dir

ENVIRONMENT = "posttrain.env.arithmetic:arithmetic_tool_environment"
#: Steps of stage 1 (the call) and of stage 2 (the copy, from stage 1's final model).
STAGE1_STEPS, STAGE2_STEPS = 600, 600


def build_config() -> PosttrainConfig:
    cfg = build_clipped_config()
    cfg.job.name = "tools_addition"
    cfg.model.name_or_path = "outputs/models/arith-tools-init"
    cfg.model.init_preset = "arith_tools"

    cfg.data.digits = 3
    cfg.data.exact_digits = True  # 100..999: sums of 3 or 4 digits, right-aligned to 4
    cfg.data.operators = "+"
    cfg.data.train_size = 20000
    cfg.data.val_size = 100
    cfg.data.prompts_per_step = 8
    cfg.rollout.n = 16
    # the call is 6 tokens with its stop token (<tool_call>A+U</tool_call><eos>), the answer 5
    # (" 579" or "1035", then <eos>); a little more leaves room to explore without being cut
    cfg.rollout.max_tokens = 8
    cfg.reward.functions = []  # the environment shapes the call and the answer
    cfg.reward.functions_anneal_steps = 0  # nothing to fade

    cfg.env.name = ENVIRONMENT
    cfg.env.max_turns = 2
    cfg.env.max_context = 80

    cfg.rl.kl_beta = 0.05
    cfg.rl.lr_schedule = "constant"
    cfg.rl.weight_decay = 0.1
    cfg.rl.max_steps = STAGE1_STEPS
    cfg.rl.eval_every = 100
    cfg.rl.save_every = STAGE1_STEPS
    return cfg


def stage2(stage1: PosttrainConfig) -> PosttrainConfig:
    """A stage-1 config made its stage 2 (in place): the same recipe from that run's final model
    for ``STAGE2_STEPS`` more steps. The KL anchor is the initial model, so it becomes the stage-1
    policy, one that calls right (a reference reset, as ProRL does periodically); anchored to
    the random init, the copy was not learned in 1,200 steps (docs/guides/tools.md). The seed is
    stage 1's, so stage 2 draws the same prompts in the same order; the model path is stage 1's
    default run directory (``job.output_root`` as the recipe sets it; override
    ``model.name_or_path`` for a stage 1 run elsewhere)."""
    stage1.model.name_or_path = str(final_model_dir(stage1))
    stage1.model.init_preset = None
    stage1.job.name = f"{stage1.job.name}_stage2"
    stage1.rl.max_steps = STAGE2_STEPS
    stage1.rl.save_every = STAGE2_STEPS
    return stage1
