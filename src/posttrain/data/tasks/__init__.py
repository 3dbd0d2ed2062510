"""Task sources (what the policy is asked), prompt templates (how it is asked)."""

from posttrain.data.tasks.arithmetic import arithmetic_problem, make_arithmetic_source
from posttrain.data.tasks.base import TaskItem, TaskSource
from posttrain.data.tasks.factory import TASKS, make_task_source
from posttrain.data.tasks.jsonl import TaskDataError, make_jsonl_source, read_gsm8k_jsonl
from posttrain.data.tasks.prompts import DEFAULT_SYSTEM_PROMPT, TEMPLATES, format_prompt
from posttrain.data.tasks.reasoning_gym import make_reasoning_gym_source

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "TASKS",
    "TEMPLATES",
    "TaskDataError",
    "TaskItem",
    "TaskSource",
    "arithmetic_problem",
    "format_prompt",
    "make_arithmetic_source",
    "make_jsonl_source",
    "make_reasoning_gym_source",
    "make_task_source",
    "read_gsm8k_jsonl",
]
