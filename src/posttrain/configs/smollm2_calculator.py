"""SmolLM2-135M-Instruct with the calculator tool, on arithmetic it gets wrong unaided.

The problems (``posttrain.data.tasks.calculator_mix``: sums of four terms, three-digit
differences, three-digit products, mixed expressions; 200 held out) are two JSONL files under
``examples/smollm2_calculator``. The model folder follows ``smollm2_reasoning_gym``'s convention::

    posttrain model import-gguf --out outputs/models/smollm2-135m-instruct
    posttrain grpo --config smollm2_calculator

The model never calls the tool from this prompt, so RL alone learns nothing; the cold start is
SFT on tool-call demonstrations (``sft_smollm2_calculator``), and GRPO starts from its export
(``model.name_or_path=outputs/sft/smollm2_135m_calculator_sft/final_model``).

SmolLM2's chat template ignores ``tools=`` and has no ``tool`` role, so the environment is the
tools environment in its fallback mode (:func:`calculator_environment`): the call format is
written into the system message, after the recipe's own instruction (:data:`SYSTEM`), and each
result comes back as a user turn ``<tool_response>...</tool_response>``. The built-in
``env.name=calculator`` would hand the schema to ``tools=``, which this template drops, so the
model would never hear of the tool. ``data.system_prompt`` is :data:`SYSTEM` alone: the prompt
a run without the tool (``env.name=''``) sees. What it measured: ``docs/guides/tools.md``.
"""

from __future__ import annotations

import json
from typing import Any

from posttrain.config import PosttrainConfig
from posttrain.config.sections import DataConfig
from posttrain.configs.smollm2_reasoning_gym import build_config as smollm2_config

#: The task's instruction, with or without the tool (the tool's format is appended to it).
SYSTEM = "Answer the question. End your answer with the final result as a number."

_CALL = {"name": "calculator", "arguments": {"expression": "12 * 34 + 5"}}

#: A worked exchange before the question: with the system message alone, SmolLM2 called the
#: tool on 0 of 100 held-out problems (greedy) and 0 of 64 training samples at temperature 0.6,
#: whatever the wording (three tried), so the reward never varied. The markers are the tools
#: environment's (``posttrain.env.tools``; a test checks they match).
EXAMPLE = [
    {"role": "user", "content": "Calculate 12 * 34 + 5."},
    {"role": "assistant", "content": f"<tool_call>{json.dumps(_CALL)}</tool_call>"},
    {"role": "user", "content": "<tool_response>413</tool_response>"},
    {"role": "assistant", "content": "12 * 34 + 5 = 413"},
]

#: The environment this recipe names in ``env.name``.
ENVIRONMENT = "posttrain.configs.smollm2_calculator:calculator_environment"


class CalculatorEnv:
    """The tools environment ``inner`` with :data:`EXAMPLE` between its system message and the
    question; its steps, tools and info keys unchanged."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.inner.tools

    @property
    def info_keys(self) -> tuple[str, ...]:
        return self.inner.info_keys

    def reset(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        system, *question = self.inner.reset(item)
        return [system, *EXAMPLE, *question]

    def step(self, messages: list[dict[str, Any]]) -> Any:
        return self.inner.step(messages)


def calculator_environment() -> CalculatorEnv:
    """The calculator in the fallback mode, after :data:`SYSTEM` (SmolLM2 has no tools)."""
    # Imported here: listing the recipes (`posttrain grpo --help`) must not load transformers.
    from posttrain.env.tools import CALCULATOR, ToolsEnv

    return CalculatorEnv(ToolsEnv([CALCULATOR], native_tools=False, system=SYSTEM))


def build_config() -> PosttrainConfig:
    cfg = smollm2_config()
    cfg.job.name = "smollm2_135m_calculator"

    cfg.data = DataConfig(
        task="jsonl",
        train_path="examples/smollm2_calculator/train.jsonl",
        val_path="examples/smollm2_calculator/val.jsonl",
        # 4 prompts x 8 trajectories a step (the two-term recipe: 8 x 8): a trajectory here is
        # about twice as long (a ~200-token system message, a call, its result, the answer).
        prompts_per_step=4,
        prompt_template="chat",
        system_prompt=SYSTEM,
    )

    cfg.env.name = ENVIRONMENT
    # One call, its result, the answer: two turns do; a third leaves room for a retry.
    cfg.env.max_turns = 3
    cfg.env.max_context = 768
    cfg.rollout.max_tokens = 64

    cfg.rl.max_steps = 20
    cfg.rl.eval_every = 10
    cfg.rl.save_every = 5
    return cfg
