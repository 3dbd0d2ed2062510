"""The ``lmdpo`` section: DPO for language models on preference pairs (read only when
job.algorithm is lmdpo*).

As for SFT, the schedule (lr, steps, micro-batches, clipping, saving, evaluation cadence, resume)
stays in ``rl`` and the language model's options (LoRA, gradient checkpointing, dtype) in
``model``. This section holds the pairs and the preference loss.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from posttrain.config.base import Section


class LMDPOConfig(Section):
    """DPO on preference pairs: the pairs, how long a rendered answer may be, the loss."""

    section_name = "lmdpo"

    train_path: str | None = Field(
        None,
        min_length=1,
        description='Training JSONL: one pair a line, `{"prompt": ..., "chosen": ..., '
        '"rejected": ...}` or `{"messages": [...], "tools": [...], "chosen": ..., "rejected": '
        "...}`; chosen and rejected are a string or an assistant message. Rendered with the "
        "chat template as `sft` rows are; every pair is read before step 0. Required.",
    )
    val_path: str | None = Field(
        None,
        min_length=1,
        description="Held-out pairs of the same form: loss, rewards and reward accuracy every "
        "`rl.eval_every` steps (`val/rewards/accuracies`, ...). Null: no evaluation.",
    )
    pairs_per_step: int = Field(
        8,
        ge=1,
        description="Pairs per optimizer step, drawn in a seeded order over epochs (a pure "
        "function of job.seed and the step, so resume needs no data cursor).",
    )
    max_tokens: int = Field(
        512,
        ge=2,
        description="Longest rendered prompt + answer, in tokens (chosen and rejected each).",
    )
    truncation: Literal["error", "drop"] = Field(
        "error",
        description="A pair whose chosen or rejected renders over `lmdpo.max_tokens`: `error` "
        "refuses the file naming its line, `drop` leaves the pair out (counted in the log).",
    )
    loss: Literal["sigmoid", "ipo"] = Field(
        "sigmoid",
        description="`sigmoid`: -(1-ε) log σ(βΔ) - ε log σ(-βΔ) (DPO; cDPO with "
        "`lmdpo.label_smoothing`=ε). `ipo`: (Δ - 1/(2β))². Δ is the policy's log-ratio to the "
        "reference on chosen minus rejected, each summed over the answer's tokens.",
    )
    beta: float = Field(0.1, gt=0, description="β: the strength of the reference's pull.")
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="ε of cDPO: the share of pairs assumed mislabelled (`sigmoid` only).",
    )
    rpo_alpha: float = Field(
        0.0,
        ge=0,
        description="α of RPO (Pang et al. 2024): adds α times the chosen answer's NLL per token "
        "to each pair's loss, so the chosen answers' likelihood is held up while the margin "
        "grows (TRL's `rpo_alpha` averages the NLL over the micro-batch's chosen tokens "
        "instead). 0: plain DPO / IPO.",
    )
