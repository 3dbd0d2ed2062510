"""``PosttrainConfig``: the whole resolved configuration of one run."""

from __future__ import annotations

from pydantic import Field, model_validator

from posttrain.config.base import Section
from posttrain.config.dpo import DPOConfig
from posttrain.config.env import EnvConfig
from posttrain.config.lmdpo import LMDPOConfig
from posttrain.config.rl import RLConfig
from posttrain.config.runtime import CheckpointConfig, LoggingConfig, PlacementConfig
from posttrain.config.sections import (
    DataConfig,
    JobConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
)
from posttrain.config.sft import SFTConfig
from posttrain.config.teacher import TeacherConfig
from posttrain.config.vllm import VllmConfig


class PosttrainConfig(Section):
    """Every setting of a run. Workers rebuild it from the recipe path plus the override list."""

    job: JobConfig = Field(default_factory=JobConfig, description="Run identity and outputs.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompt source.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Sampling.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Scoring.")
    rl: RLConfig = Field(default_factory=RLConfig, description="Objective and schedule.")
    env: EnvConfig = Field(
        default_factory=EnvConfig, description="Multi-turn environment (off by default)."
    )
    teacher: TeacherConfig = Field(
        default_factory=TeacherConfig, description="Distillation teacher (OPD only)."
    )
    dpo: DPOConfig = Field(default_factory=DPOConfig, description="Diffusion DPO.")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="Supervised fine-tuning.")
    lmdpo: LMDPOConfig = Field(default_factory=LMDPOConfig, description="DPO for language models.")
    vllm: VllmConfig = Field(
        default_factory=VllmConfig, description="vLLM's engine settings (rollout.engine=vllm)."
    )
    placement: PlacementConfig = Field(
        default_factory=PlacementConfig, description="Role placement."
    )
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metrics sinks.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpoint retention."
    )

    @model_validator(mode="after")
    def _settle(self) -> PosttrainConfig:
        return self.resolved()

    def resolved(self) -> PosttrainConfig:
        """Settle the defaults that depend on another section (``rl.rollout_is_cap`` on
        ``rollout.engine``): at construction, and again after overrides (``apply_overrides``), since
        assigning to a section does not validate the whole config."""
        self.rl.resolve_is_cap(sampler_apart=self.rollout.engine == "vllm")
        return self

    @classmethod
    def sections(cls) -> dict[str, type[Section]]:
        """Section name -> section class, in schema order."""
        return {name: f.annotation for name, f in cls.model_fields.items()}  # type: ignore[misc]

    @classmethod
    def _dotted_fields(cls) -> list[str]:
        return [*cls.model_fields, *all_keys()]


def all_keys() -> list[str]:
    """Every settable dotted key (``section.field``), in schema order."""
    return [
        f"{name}.{field}"
        for name, section in PosttrainConfig.sections().items()
        for field in section.model_fields
    ]


def objective_family(config: PosttrainConfig) -> str:
    """The entry that trains the run and whose built-in objective it uses: the registered entry
    whose name ``job.algorithm`` starts with, else ``grpo`` (``entrypoints/registry.py``)."""
    from posttrain.entrypoints.registry import family_of

    return family_of(config.job.algorithm)
