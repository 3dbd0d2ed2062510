"""Three-digit addition with the calculator: the recipe `make demo-tools` trains (and its twin).

A 135k-parameter Mistral (preset ``arith_tools``: Llama layers that attend to the last 10
tokens; the arithmetic alphabet, the roles of the tools chat template and the tool-call markers
as single tokens) starts from random weights. Adding two
three-digit numbers is out of its reach in the step budget; with the calculator it is a copy
task. The environment (``posttrain.env.arithmetic``) binds the operands to the names ``A`` and
``U``, so the right call is the same for every problem, ``<tool_call>A+U</tool_call>`` (the
compact call form), and what is left is copying the tool's result (right-aligned to four
characters) into the answer. Nothing tells the model about the tool; it is found by reward
alone:

- the environment pays up to 1.0 for the first call (opening it, closing it, a right result, or
  part of ``A+U``'s characters for a wrong one) and, after a right call, up to 1.0 for the
  answer's copy of the result, character by character: a term of the score next to the
  verifier's (``train/reward_env_mean``); the exact verifier pays 1 for a right answer;
- the KL anchor to the random init at half ``arithmetic_clipped``'s weight (0.05) and a constant
  learning rate (the copy is learned after the call, late in the run), 16 samples per prompt and
  otherwise ``arithmetic_clipped``'s optimiser.

``tools_addition_notool`` is this recipe without the environment (single-turn answers, the same
model, steps and optimiser), with ``digit_match`` paying for partly right digits in its place,
the baseline the demo compares with.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig
from posttrain.configs.arithmetic_clipped import build_config as build_clipped_config

ENVIRONMENT = "posttrain.env.arithmetic:arithmetic_tool_environment"


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

    cfg.env.name = ENVIRONMENT
    cfg.env.max_turns = 2
    cfg.env.max_context = 80

    cfg.rl.kl_beta = 0.05
    cfg.rl.lr_schedule = "constant"
    cfg.rl.max_steps = 1000
    cfg.rl.eval_every = 100
    cfg.rl.save_every = 1000
    return cfg
