"""The ``sft`` section: supervised fine-tuning on chat rows (read only when job.algorithm is sft*).

The optimisation schedule (lr, its schedule and warmup, steps, micro-batches, clipping, saving,
evaluation cadence, resume) stays in ``rl``, its single owner, as for DPO; the language model's
options (LoRA, gradient checkpointing, dtype) stay in ``model``. This section holds the data and
the loss's unit.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from posttrain.config.base import Section


class SFTConfig(Section):
    """Supervised fine-tuning: the demonstrations, how long a row may be, the loss's unit."""

    section_name = "sft"

    train_path: str | None = Field(
        None,
        min_length=1,
        description='Training JSONL: one row a line, OpenAI-style `{"messages": [...], "tools": '
        "[...]}` (roles system, user, assistant with optional `tool_calls`, tool) or "
        '`{"prompt": ..., "completion": ...}`. Every row is read and rendered before step 0. '
        "Required.",
    )
    val_path: str | None = Field(
        None,
        min_length=1,
        description="Held-out JSONL of the same form: loss and token accuracy every "
        "`rl.eval_every` steps (`val/loss`, `val/token_accuracy`). Null: no evaluation.",
    )
    rows_per_step: int = Field(
        8,
        ge=1,
        description="Rows per optimizer step, drawn in a seeded order over epochs (a pure "
        "function of job.seed and the step, so resume needs no data cursor).",
    )
    max_tokens: int = Field(
        512,
        ge=2,
        description="Longest rendered row, in tokens (the template's text included).",
    )
    truncation: Literal["error", "drop", "truncate"] = Field(
        "error",
        description="A row longer than `sft.max_tokens`: `error` refuses the file naming its "
        "line, `drop` leaves the row out (counted in the log), `truncate` keeps its first "
        "`sft.max_tokens` tokens (a row left with no assistant token is dropped).",
    )
    packing: bool = Field(
        False,
        description="Concatenate each step's rows into sequences of at most `sft.max_tokens` "
        "tokens (first fit, longest first), each row attending to itself only (positions "
        "restart per row), so little is padding. Needs `sft.loss_reduction=token_sum`.",
    )
    loss_reduction: Literal["token_sum", "sequence_mean"] = Field(
        "token_sum",
        description="`token_sum`: the mean negative log-likelihood over every assistant token "
        "of the step (each token weighs the same). `sequence_mean`: each row's mean over its "
        "assistant tokens, averaged over rows (each row weighs the same). Both are exact under "
        "any micro-batch split.",
    )
