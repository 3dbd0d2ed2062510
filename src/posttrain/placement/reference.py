"""The frozen KL reference as a role on the data side (``placement.reference_on``).

Inside the update the reference forward sits on the policy's critical path (on ``small`` about a
third of the update). Its log-probs depend on the batch alone, never on the policy's weights, so
they can be computed wherever a frozen copy lives, as soon as the batch is sampled: under
``rl.off_policy_lag`` the pipeline's data thread runs this role right after the rollout of step
``s + k`` while the policy trains step ``s``. The batch then carries them as the
``reference_logprobs`` column and the objective's ``ReferenceScorer`` reads it
(``DataSideReference``), running no forward.

Exactness: the role is built as the policy builds its reference (full fine-tuning: a frozen
load in ``model.dtype``; LoRA: the base with LoRA applied and its adapters off, the very module
type the policy scores with) and scores under the update's forward context (bf16 autocast,
``rl.shared_prefix``), in the update's own micro-batches: the rows each policy rank's trainer puts
into each micro-batch (:func:`update_rows`). Same module, same rows, same shapes: the log-probs
are bit-identical to the policy side's. The one exception is ``placement.policy_sharding=fsdp``
with ``model.dtype=bfloat16`` and LoRA, where the policy's reference runs under FSDP's parameter
cast and this role under autocast (differences at bf16 rounding).
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from posttrain.algorithm.primitives.objective import (
    REFERENCE_COLUMN,
    DataSideReference,
    Reduction,
)
from posttrain.config import PosttrainConfig
from posttrain.config.build import (
    objective_builder,
    objective_context,
)
from posttrain.data.logprobs import response_logprobs
from posttrain.data.prefix import use_shared_prefix
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.model.loading import load_policy
from posttrain.model.lora import AdapterFreeReference, apply_lora
from posttrain.placement.dispatch import rank_rows
from posttrain.placement.specs import RoleSpec
from posttrain.trainer.accumulate import split_evenly
from posttrain.trainer.llm import update_micro_slices


class ReferenceRole:
    """Loads the frozen reference and annotates each collected batch with its log-probs."""

    def __init__(self, config: PosttrainConfig, device: str | None = None) -> None:
        self.config = cfg = config
        m = cfg.model
        if m.lora_rank:  # as PolicyRole: float32 base, LoRA applied, scored with adapters off
            base, _ = load_policy(m.name_or_path, None, "float32", device)
            lora = apply_lora(base, m.lora_rank, m.lora_alpha, m.lora_target_modules, cfg.job.seed)
            self.model: torch.nn.Module = AdapterFreeReference(lora)
        else:
            self.model, _ = load_policy(m.name_or_path, None, m.dtype, device)
        self.model.eval().requires_grad_(False)
        self.temperature = float(cfg.rl.temperature)
        # The trainer's rule for regrouping rows (LLMTrainer.keeps_groups) reads the objective's
        # reduction: build the run's objective (no model) to read it.
        objective = objective_builder(cfg)(cfg.rl, objective_context(cfg, DataSideReference()))
        self.keeps_groups = (
            cfg.rl.shared_prefix != "off"
            and objective.reduction is Reduction.TOKEN_SUM
            and not m.certified_deterministic_forward
        )

    def _context(self, device: torch.device) -> contextlib.ExitStack:
        """The update's forward context (``Trainer.forward_context``, ``LLMTrainer``'s)."""
        stack = contextlib.ExitStack()
        pc = self.config.placement
        if self.config.model.dtype == "bfloat16" and pc.policy_sharding != "fsdp":
            stack.enter_context(torch.autocast(device_type=device.type, dtype=torch.bfloat16))
        stack.enter_context(use_shared_prefix(self.config.rl.shared_prefix))
        return stack

    @torch.no_grad()
    def annotations(self, batch: TrajectoryBatch) -> dict[str, Tensor]:
        """``{"reference_logprobs": [B, R]}`` on the CPU, scored in the update's micro-batches."""
        device = next(self.model.parameters()).device
        out: Tensor | None = None
        for rows in update_rows(batch, self.config, self.keeps_groups):
            idx = torch.as_tensor(rows, dtype=torch.long)
            with self._context(device):
                logp = response_logprobs(self.model, batch[idx].to(device), self.temperature)
            if out is None:
                out = torch.zeros(batch.response_mask.shape, dtype=logp.dtype)
            out[idx] = logp.cpu()
        if out is None:
            out = torch.zeros(batch.response_mask.shape)
        return {REFERENCE_COLUMN: out}


def update_rows(batch: TrajectoryBatch, config: PosttrainConfig, keeps_groups: bool) -> list:
    """Row indices of ``batch`` in each micro-batch of its update, over every policy rank and
    mini-batch: ``placement.dispatch.shard_batch``'s shards, the trainer's ``split_evenly``
    mini-batches, then ``update_micro_slices``."""
    rl, ranks = config.rl, config.placement.policy_ranks
    minis = rl.mini_batch_per_replica
    if ranks == 1:
        shards = [list(range(len(batch)))]
    else:
        shards = rank_rows(
            len(batch), ranks, minis, batch.group_ids.tolist() if keeps_groups else None
        )
    out = []
    for shard in shards:
        for part in split_evenly(len(shard), minis):
            rows = shard[part]
            mini = batch[rows]
            for s in update_micro_slices(mini, rl.micro_batch_size, rl.micro_batch_tokens,
                                         rl.shared_prefix, keeps_groups):  # fmt: skip
                out.append(rows[s] if isinstance(s, slice) else [rows[i] for i in s])
    return out


#: The reference as a declared role: it reads the sampled sequences and adds its log-probs.
REFERENCE = RoleSpec(name="reference", build=ReferenceRole, adds=(REFERENCE_COLUMN,))
