"""Config sections for the job, the model, the data, the rollout and the reward."""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, field_validator

from posttrain.config.base import Section

#: The ``chat`` template's system message unless ``data.system_prompt`` says otherwise: it asks
#: for the final answer in ``\\boxed{}``, the format the verifiers read first.
DEFAULT_SYSTEM_PROMPT = (
    "Solve the problem step by step. Then give the final answer, and nothing else, inside "
    "\\boxed{}, once, at the end of your response. For example: \\boxed{42}."
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_FUNCTION_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def _path_safe(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError(
            "must start with a letter or digit and use only letters, digits, '_', '.', '-' "
            "(it names an output directory)"
        )
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be finite")
    return value


class JobConfig(Section):
    """What the run is called and where it writes."""

    section_name = "job"

    name: str = Field(
        "default",
        description="Run name. With `job.algorithm` it separates output directories, the saved "
        "resolved config, metrics provenance and automatic resume.",
    )
    algorithm: str = Field(
        "grpo",
        description="Algorithm label recorded for provenance (`grpo`, `dr_grpo`, `gspo`, `opd`). "
        "A label starting with an entry's name (`opd`, `dpo`, ...: `posttrain --help` lists "
        "them) belongs to that entry and its preflight rules; any other label to `grpo`.",
    )
    seed: int = Field(0, ge=0, description="Seed for data order, sampling and initialisation.")
    output_root: str = Field(
        "outputs",
        min_length=1,
        description="Directory under which runs write "
        "`<output_root>/<algorithm>/<name>/` (checkpoints, metrics, resolved config).",
    )

    _check_name = field_validator("name", "algorithm")(_path_safe)


class ModelConfig(Section):
    """Which policy network to load and the capabilities it declares."""

    section_name = "model"

    name_or_path: str = Field(
        "outputs/models/tiny-arith",
        min_length=1,
        description="Local Hugging Face model directory of the policy (nothing is downloaded). "
        "The default is where the arithmetic demo keeps its tiny from-scratch model.",
    )
    tokenizer_path: str | None = Field(
        None,
        min_length=1,
        description="Local tokenizer directory; null means the tokenizer lives in "
        "`model.name_or_path`.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Parameter and compute dtype of the policy; logprobs are computed in it.",
    )
    certified_deterministic_forward: bool = Field(
        False,
        description="Capability: the forward gives bitwise-identical logprobs for a sample "
        "whatever else is in its batch, so an on-policy ratio is exactly 1. Set it only for a "
        "model whose kernels you have checked.",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass to save memory."
    )
    lora_rank: int = Field(
        0,
        ge=0,
        description="LoRA rank (through peft): > 0 trains only low-rank adapters on "
        "`model.lora_target_modules`, the base stays frozen and, with `rl.kl_beta` > 0, serves "
        "as the KL reference with its adapters switched off (no second copy). 0 trains every "
        "weight.",
    )
    lora_alpha: float = Field(
        16.0,
        gt=0,
        description="LoRA scale numerator: the adapter update is (lora_alpha / lora_rank) B A.",
    )
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Names of the linear modules that get adapters (peft `target_modules`), "
        "e.g. `[q_proj, v_proj]` or add `gate_proj, up_proj, down_proj` for the MLP.",
    )
    compile: bool = Field(
        False,
        description="torch.compile the micro-batch forward and log-prob (the first step of each "
        "new shape pays the compilation). Worth it on a GPU; on the CPU it rarely pays off.",
    )
    init_preset: (
        Literal["tiny", "small", "arith", "arith_h32", "arith_tools", "tiny_tools"] | None
    ) = Field(
        None,
        description="When set and `model.name_or_path` does not exist yet, the entry builds a "
        "randomly initialised Llama-family model of this preset (a Mistral for `arith_tools`: its "
        "layers attend to the last 10 tokens) with a char-level "
        "tokenizer there (seeded by `job.seed`; `arith_tools` and `tiny_tools` add the tool-call "
        "markers and a chat template for multi-turn runs; `arith_h32` is `arith` with one head "
        "of 32, which vLLM's CPU attention takes). Null: the directory must already exist.",
    )

    _check_alpha = field_validator("lora_alpha")(_finite)


class DataConfig(Section):
    """The prompt source, its size and how prompts are rendered."""

    section_name = "data"

    task: Literal["arithmetic", "jsonl", "reasoning_gym"] = Field(
        "arithmetic",
        description="Prompt source: generated arithmetic problems, a JSONL file of "
        "question/answer rows (GSM8K format), or a reasoning_gym dataset.",
    )
    train_path: str | None = Field(
        None,
        min_length=1,
        description="Training JSONL file; required by, and read only for, `task=jsonl`.",
    )
    val_path: str | None = Field(
        None, min_length=1, description="Validation JSONL file; read only for `task=jsonl`."
    )
    reasoning_gym_dataset: str = Field(
        "basic_arithmetic",
        min_length=1,
        description="reasoning_gym dataset name; read only for `task=reasoning_gym`.",
    )
    reasoning_gym_options: dict[str, bool | int | float | str | list[bool | int | float | str]] = (
        Field(
            default_factory=dict,
            description="Keyword options of the reasoning_gym dataset (its difficulty knobs, e.g. "
            "`{min_digits: 1, max_digits: 2, min_terms: 2, max_terms: 2, operators: ['+', '-']}` "
            "for basic_arithmetic); read only for `task=reasoning_gym`.",
        )
    )
    digits: int = Field(
        2, ge=1, le=18, description="Digits per operand; read only for `task=arithmetic`."
    )
    exact_digits: bool = Field(
        False,
        description="Operands have exactly `data.digits` digits (100..999 for 3) instead of up "
        "to that many (0..999); read only for `task=arithmetic`.",
    )
    operators: str = Field(
        "+",
        description="Operators to draw from, a subset of `+-*` without repeats, e.g. `+-`; "
        "read only for `task=arithmetic`.",
    )
    train_size: int = Field(
        1000, ge=1, description="Number of generated training problems (generated tasks)."
    )
    val_size: int = Field(
        64, ge=0, description="Number of generated validation problems; 0 means none."
    )
    prompts_per_step: int = Field(
        8, ge=1, description="Prompts per optimizer step; each is sampled `rollout.n` times."
    )
    allow_repeats: bool = Field(
        False,
        description="Allow `data.prompts_per_step` above the number of distinct train prompts "
        "(every step then samples some prompts more than once); refused otherwise.",
    )
    prompt_template: Literal["plain", "chat"] = Field(
        "plain",
        description="`plain` feeds the question text as is; `chat` applies the tokenizer's "
        "chat template.",
    )
    system_prompt: str | None = Field(
        DEFAULT_SYSTEM_PROMPT,
        description="System message of the `chat` template (default: asks for the final answer "
        "in `\\boxed{}`, the format `reward.format_weight` rewards); null sends none, for chat "
        "templates that reject the system role. Read only for `prompt_template=chat`.",
    )
    user_template: str = Field(
        "{prompt}",
        description="The text the question is placed in: `{prompt}` stands for the item's "
        "question, everything else is sent as written (braces too, e.g. `\\boxed{7}`). The "
        "user turn under `chat`, the whole prompt under `plain`.",
    )
    prompt_truncation: Literal["error", "left", "right"] = Field(
        "error",
        description="A prompt longer than the model's context minus `rollout.max_tokens`: "
        "`error` refuses the run naming the row; `left` drops the start of the question text "
        "(keeps its end), `right` drops its end; truncated rows are counted in a warning.",
    )

    @field_validator("user_template")
    @classmethod
    def _check_user_template(cls, value: str) -> str:
        if value.count("{prompt}") != 1:
            raise ValueError("must contain `{prompt}` (where the question goes) exactly once")
        return value

    @field_validator("operators")
    @classmethod
    def _check_operators(cls, value: str) -> str:
        if not value or set(value) - set("+-*") or len(set(value)) != len(value):
            raise ValueError("must be a non-empty subset of '+-*' without repeats, e.g. '+-'")
        return value


class RolloutConfig(Section):
    """How responses are sampled from the policy."""

    section_name = "rollout"

    n: int = Field(
        8,
        ge=2,
        description="Responses sampled per prompt (the group); at least 2 so a group-relative "
        "advantage exists.",
    )
    temperature: float = Field(
        1.0,
        gt=0,
        description="Sampling temperature; the selected surrogate fixes which values are allowed.",
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass; 1 disables it.")
    max_tokens: int = Field(
        256,
        gt=0,
        description="Maximum response length in tokens: the only response bound. Also the fixed "
        "divisor of `rl.loss_type=seq-mean-token-sum-fixed`. Strict positive integer (bool, "
        "fractional, zero and negative values are rejected).",
    )
    engine: Literal["torch", "static", "vllm"] = Field(
        "torch",
        description="Sampling engine. `torch`: HF forwards with a growing KV cache, finished "
        "rows dropped (fastest on the CPU). `static`: fixed KV buffers and a decode step without "
        "host syncs, captured as CUDA graphs on a GPU (Llama-family models only; eager on CPU). "
        "`vllm`: vLLM in its own process and environment (`make install-vllm`; settings in the "
        "`vllm` section), full weights reloaded after every update (a LoRA policy's adapters "
        "through vLLM's LoRA path, or merged: `vllm.lora_sync`); multi-turn environments, "
        "OPD, Ray placement, a lag and tensor parallelism (`vllm.tensor_parallel_size`) "
        "compose with it: docs/guides/vllm.md.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Weights the engine samples with. `float32` on the policy's device samples "
        "with the policy module itself (no copy); any other dtype gives the engine its own copy, "
        "refreshed from the float32 master weights after every update. `auto`: bfloat16 where "
        "the device has native bf16 matmuls (CUDA with bf16; a CPU with AMX-BF16 or "
        "AVX512-BF16, read from torch's cpuinfo probe or /proc/cpuinfo), else float32; the "
        "placement log line says which and why. The loss scores π_old with the trainer's own forward either way; "
        "the gap is published as `train/rollout/logprob_abs_diff`.",
    )

    _check_temperature = field_validator("temperature", "top_p")(_finite)


class RewardConfig(Section):
    """How responses are scored."""

    section_name = "reward"

    verifier: Literal["exact", "math", "last_number", "reasoning_gym"] = Field(
        "exact",
        description="Answer check: `exact` compares the extracted answer with the gold string, "
        "`math` compares by value with math-verify, `last_number` takes the marked answer or "
        "else the last number written (for answers stated in prose), `reasoning_gym` asks the "
        "task's own reasoning-gym scorer (needs `data.task=reasoning_gym`).",
    )
    format_weight: float = Field(
        0.0, ge=0, description="Weight of the format reward added to the verifier's score."
    )
    functions: list[str] = Field(
        default_factory=list,
        description="Extra reward functions as `module:function` references, summed with the "
        "verifier's score.",
    )
    functions_anneal_steps: int = Field(
        0,
        ge=0,
        description="Fade the reward functions out over the first N steps: at step s their sum "
        "is weighted 1 - (s - 1) / N clamped to [0, 1] (full at step 1 and at step 0's "
        "evaluation, none from step N + 1 on; the held-out evaluation at step s uses the same "
        "weight). 0 keeps them at full weight. For "
        "a dense shaping reward that bootstraps learning but keeps paying near misses, which "
        "it ranks above the rest of a group with no exact answer (measured on "
        "`arithmetic_clipped`: docs/guides/seeds.md). Read only with `reward.functions` set.",
    )
    shared_prefix_mask: bool = Field(
        False,
        description="Mask the loss on response tokens that every member of a group shares as "
        "a prefix (applied in the reward stage, before dispatch).",
    )

    overlong_buffer: int = Field(
        0,
        ge=0,
        description="DAPO soft overlong punishment: a response of L tokens loses "
        "`reward.overlong_penalty` * min(1, max(0, L - (rollout.max_tokens - overlong_buffer)) / "
        "overlong_buffer), a linear ramp over the last `overlong_buffer` tokens before "
        "`rollout.max_tokens`. 0 disables it.",
    )
    overlong_penalty: float = Field(
        1.0,
        gt=0,
        description="Largest overlong punishment (reached at `rollout.max_tokens`); read only "
        "when `reward.overlong_buffer` > 0.",
    )
    mask_truncated: bool = Field(
        False,
        description="Drop responses that hit `rollout.max_tokens` without ending from the loss "
        "(DAPO overlong filtering): their response mask is cleared in the reward stage, after "
        "they have counted towards their group's advantages.",
    )

    _check_weight = field_validator("format_weight", "overlong_penalty")(_finite)

    @field_validator("functions")
    @classmethod
    def _check_functions(cls, value: list[str]) -> list[str]:
        for ref in value:
            if not _FUNCTION_REF.match(ref):
                raise ValueError(f"{ref!r} is not a 'module:function' reference")
        return value
