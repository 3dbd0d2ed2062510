"""The ``teacher`` section: the frozen model that on-policy distillation (OPD) learns from."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from posttrain.config.base import Section


class TeacherConfig(Section):
    """The distillation teacher; read only by the OPD entry (``job.algorithm=opd``)."""

    section_name = "teacher"

    name_or_path: str | None = Field(
        None,
        min_length=1,
        description="Local Hugging Face directory of the teacher (nothing is downloaded); "
        "required by OPD. Its tokenizer must be the student's: same vocabulary, same ids.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Parameter and compute dtype of the teacher; its log-probs travel as float32.",
    )
    top_k: int = Field(
        64,
        ge=1,
        description="OPD direct mode only: how many of the teacher's most likely next tokens "
        "travel per response position (the rest of its mass travels as one remainder bucket). "
        "At or above the vocabulary size the divergence is exact over the full vocabulary.",
    )
