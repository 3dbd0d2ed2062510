"""A user's own recipe: GRPO on word problems from two JSONL files next to this file.

    posttrain config show --config examples/jsonl_recipe/recipe.py    # checks the files too
    posttrain grpo --config examples/jsonl_recipe/recipe.py -- rl.max_steps=20

Each line of ``train.jsonl`` / ``val.jsonl`` is one problem in GSM8K's format::

    {"question": "Pia has 3 marbles and finds 2 more. How many ...?",
     "answer": "Pia has 3 + 2 = 5 marbles.\\n#### 5"}

``answer`` is the worked solution; its last ``#### N`` line is the gold answer (a number,
thousands commas allowed). A held-out question must not repeat a train question.

The model is a from-scratch tiny Llama (``model.init_preset=tiny``, built on the first run),
so this runs on a laptop CPU in seconds; it shows the plumbing, it will not learn arithmetic in
words. For a real model, point ``model.name_or_path`` at a local Hugging Face folder, drop
``init_preset`` and use ``data.prompt_template = "chat"`` if the tokenizer has a chat template.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.config import PosttrainConfig

#: The data files sit next to this recipe, so it runs from any working directory.
HERE = Path(__file__).resolve().parent


def build_config() -> PosttrainConfig:
    cfg = PosttrainConfig()
    cfg.job.name = "word_problems"
    cfg.job.algorithm = "grpo"
    cfg.model.name_or_path = "outputs/models/tiny-words"
    cfg.model.init_preset = "tiny"

    cfg.data.task = "jsonl"
    cfg.data.train_path = str(HERE / "train.jsonl")
    cfg.data.val_path = str(HERE / "val.jsonl")
    cfg.data.prompts_per_step = 4  # at most the 12 distinct train questions
    cfg.data.user_template = "Q: {prompt}\nA: "

    cfg.rollout.n = 4
    cfg.rollout.max_tokens = 6
    cfg.reward.verifier = "last_number"  # the last number of the response, compared by value

    cfg.rl.grpo_surrogate = "clipped"
    cfg.rl.lr = 1e-3
    cfg.rl.max_steps = 20
    cfg.rl.eval_every = 10
    cfg.rl.save_every = 10
    cfg.rl.micro_batch_size = 16
    cfg.placement.torch_threads_per_process = 1
    return cfg
