"""The diffusion policy role of the DPO entry, placed in-process or as one Ray actor
(``placement/policy_only.py``).

The role owns the UNet, its trainer (built by the entry's ``build_trainer``, which travels by
module and name like an objective builder) and the run's checkpoints; it also samples, because
it holds the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from posttrain.config import PosttrainConfig, to_dict
from posttrain.data.images import PairBatch
from posttrain.model.diffusion import load_pipeline, sample
from posttrain.trainer import CheckpointManager, ResumeState

TrainerBuilder = Callable[..., Any]


class DiffusionPolicyRole:
    """One diffusion policy: model, trainer, checkpoints, sampling."""

    def __init__(
        self,
        config: PosttrainConfig,
        build_trainer_fn: TrainerBuilder,
        run_dir: str,
        device: str | None = None,
    ) -> None:
        self.config = cfg = config
        unet, self.scheduler = load_pipeline(cfg.model.name_or_path, device or "cpu")
        self.trainer = build_trainer_fn(cfg, unet, self.scheduler, device)
        self.model = self.trainer.model
        self.checkpoints = CheckpointManager(
            Path(run_dir) / "checkpoints", keep_last=cfg.checkpoint.keep_last
        )

    def resume(self) -> ResumeState | None:
        return self.checkpoints.resume(
            self.trainer, mode=self.config.rl.resume, config=to_dict(self.config)
        )

    def train(self, batch: PairBatch) -> dict[str, float]:
        return self.trainer.train_on_batch(batch, mini_batches=1)[0]

    def save(self, step: int, data_state: Mapping[str, Any]) -> str:
        path = self.checkpoints.save(
            step, self.trainer, config=to_dict(self.config), data_state=dict(data_state)
        )
        return str(path)

    def sample(self, labels: Tensor, seeds: Sequence[int], steps: int, eta: float) -> Tensor:
        return sample(self.model, self.scheduler, labels, seeds, steps, eta)


def place_diffusion(
    config: PosttrainConfig,
    config_path: str,
    opts: Sequence[str],
    build_trainer_fn: TrainerBuilder,
    run_dir: str,
):
    """The policy role where ``placement.backend`` says (``.policy``, ``.close()``): the
    policy-only placement DPO shares with SFT (``placement/policy_only.py``)."""
    from posttrain.placement.policy_only import place_policy_only

    kwargs = {"build_trainer_fn": build_trainer_fn}
    return place_policy_only(config, config_path, opts, DiffusionPolicyRole, kwargs, run_dir)
