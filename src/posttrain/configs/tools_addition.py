"""Three-digit addition with the calculator: the recipe `make demo-tools` trains (and its twin).

A 135k-parameter Llama (preset ``arith_tools``: the arithmetic alphabet, the roles of the tools
chat template and the tool-call markers as single tokens) starts from random weights. Adding two
numbers of up to three digits is out of its reach in the step budget; with the calculator it is
a copy task: copy the expression into ``<tool_call>...</tool_call>`` (the compact call form),
then copy the tool's answer. Nothing tells the model about the tool; it is found by reward alone:

- the environment (``posttrain.env.arithmetic``) pays up to 0.5 for the first call (opening it,
  closing it, copying the expression): a term of the score next to the verifier's
  (``train/reward_env_mean``);
- ``digit_match`` pays a little for a final answer whose digits are partly right, the exact
  verifier 1 for a right one;
- the KL anchor to the random init, 16 samples per prompt and the optimiser of
  ``arithmetic_clipped``.

``tools_addition_notool`` is this recipe without the environment (single-turn answers, the same
model, rewards on the answer and steps), the baseline the demo compares with.
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
    cfg.data.exact_digits = True  # 100..999: the call copies from a fixed offset
    cfg.data.operators = "+"
    cfg.data.train_size = 20000
    cfg.data.val_size = 100
    cfg.data.prompts_per_step = 8
    cfg.rollout.n = 16
    # a compact call is 10 tokens with its stop token (<tool_call>123+456</tool_call><eos>); a
    # little more leaves room to explore without being cut
    cfg.rollout.max_tokens = 14
    cfg.reward.functions = ["posttrain.reward.shaping:digit_match"]

    cfg.env.name = ENVIRONMENT
    cfg.env.max_turns = 2
    cfg.env.max_context = 80

    cfg.rl.max_steps = 800
    cfg.rl.eval_every = 100
    cfg.rl.save_every = 800
    return cfg
