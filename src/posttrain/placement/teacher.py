"""The teacher role of on-policy distillation: a frozen model that scores the student's samples.

It sits on one data edge, rollout -> teacher -> reward stage: it receives the sampled batch and
returns annotations only (the batch itself stays with the caller), as CPU tensors:

- ``teacher_logprobs`` ``[B, R]`` float32: log π_teacher of each sampled response token;
- direct mode only, ``teacher_topk_ids`` ``[B, R, K]`` int64 and ``teacher_topk_logprobs``
  ``[B, R, K]`` float32: the teacher's K most likely next tokens at every response position,
  K = min(``teacher.top_k``, vocabulary).

All at the loss temperature ``rl.temperature`` and zero on padding. :data:`TEACHER` declares
the role (``placement/specs.py``); the OPD entry passes it to the loop, and either placement
builds this class from it, in-process or inside the teacher's Ray actor.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from posttrain.config import ConfigError, PosttrainConfig
from posttrain.data.logprobs import response_logits
from posttrain.data.prefix import use_shared_prefix
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.model.loading import load_policy, load_tokenizer
from posttrain.placement.specs import RoleSpec


def annotation_bytes(annotations: dict[str, Tensor]) -> int:
    """Bytes of the tensors the teacher sends back per step (what travels on its return edge)."""
    return sum(t.numel() * t.element_size() for t in annotations.values())


class TeacherRole:
    """Loads ``teacher.name_or_path`` frozen in eval mode and scores sampled responses."""

    def __init__(self, config: PosttrainConfig, device: str | None = None) -> None:
        self.config = cfg = config
        self.model, _ = load_policy(cfg.teacher.name_or_path, None, cfg.teacher.dtype, device)
        self.model.eval().requires_grad_(False)
        self.temperature = float(cfg.rl.temperature)
        self.top_k = cfg.teacher.top_k if cfg.rl.distillation_mode == "direct" else 0
        self.chunk = cfg.rl.micro_batch_size

    @torch.no_grad()
    def annotations(self, batch: TrajectoryBatch) -> dict[str, Tensor]:
        """The teacher's annotations of ``batch`` (see the module docstring), on the CPU."""
        device = next(self.model.parameters()).device
        parts: dict[str, list[Tensor]] = {}
        for start in range(0, len(batch), self.chunk):
            chunk = batch[start : start + self.chunk].to(device)
            for name, value in self._score_chunk(chunk).items():
                parts.setdefault(name, []).append(value.cpu())
        return {name: torch.cat(values) for name, values in parts.items()}

    def _score_chunk(self, batch: TrajectoryBatch) -> dict[str, Tensor]:
        with use_shared_prefix(self.config.rl.shared_prefix):
            logits = response_logits(self.model, batch).float()
        logp_all = torch.log_softmax(logits / self.temperature, dim=-1)
        m = batch.response_mask
        picked = logp_all.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
        out = {"teacher_logprobs": torch.where(m, picked, 0)}
        if self.top_k:
            k = min(self.top_k, logp_all.shape[-1])
            logp, ids = logp_all.topk(k, dim=-1)
            out["teacher_topk_ids"] = torch.where(m.unsqueeze(-1), ids, 0)
            out["teacher_topk_logprobs"] = torch.where(m.unsqueeze(-1), logp, 0)
        return out


#: The OPD teacher as a declared role: it reads the sampled sequences and adds its log-probs
#: (and, in the direct mode, its top-k next-token distribution).
TEACHER = RoleSpec(
    name="teacher",
    build=TeacherRole,
    adds=("teacher_logprobs", "teacher_topk_ids", "teacher_topk_logprobs"),
)


def check_teacher_tokenizer(config: PosttrainConfig) -> None:
    """The teacher must tokenize exactly as the student does: OPD compares log-probs of the same
    token ids. Reads only tokenizer files and ``config.json``; one-line :class:`ConfigError`."""
    t_path = Path(config.teacher.name_or_path or "")
    if not (t_path / "config.json").is_file():
        raise ConfigError(
            f"teacher.name_or_path={str(t_path)!r} is not a Hugging Face model directory (no "
            "config.json); point it at the teacher's local folder"
        )
    s_path = Path(config.model.tokenizer_path or config.model.name_or_path)
    student, teacher = load_tokenizer(s_path).get_vocab(), load_tokenizer(t_path).get_vocab()
    if student != teacher:
        diff = sorted(set(student.items()) ^ set(teacher.items()), key=str)
        raise ConfigError(
            f"teacher.name_or_path={str(t_path)!r} has a different tokenizer than the student "
            f"({s_path}): {len(student)} vs {len(teacher)} tokens, first difference {diff[0]}; "
            "OPD compares log-probs of the same token ids, so the teacher must share the "
            "student's vocabulary"
        )
    sizes = [_vocab_size(p) for p in (Path(config.model.name_or_path), t_path)]
    if sizes[0] != sizes[1]:
        raise ConfigError(
            f"teacher.name_or_path={str(t_path)!r} has vocab_size {sizes[1]} but the student "
            f"has {sizes[0]}; OPD needs the same output vocabulary"
        )


def _vocab_size(path: Path) -> int | None:
    return json.loads((path / "config.json").read_text()).get("vocab_size")
