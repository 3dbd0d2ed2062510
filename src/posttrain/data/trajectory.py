"""The batch contract between the reward stage, dispatch, the trainer and objectives.

Layout (the convention of most RL trainers): prompts are left-padded to a common width P,
responses right-padded to a common width R, so ``input_ids`` is ``[B, P + R]`` and every
per-token tensor an objective reads is ``[B, R]``, aligned with the response tokens. Position
``t`` of a ``[B, R]`` tensor refers to response token ``t``, whose logprob is predicted by the
logits at sequence position ``P + t - 1``. Keeping only the response region lets the logprob
helper ask the model for ``R + 1`` logit rows instead of ``P + R``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

_PER_TOKEN = ("rollout_logprobs", "teacher_logprobs")

#: The column of a packed batch (several documents per row, SFT's ``sft.packing``): ``[B, R]``
#: int64, each response token's position within its own document. A forward given it passes
#: these positions (the prompt columns at ``0 .. P-1``) and no padding mask, so the model
#: attends within each document only (``data/logprobs.py``); no prompt is shared.
DOCUMENT_POSITIONS = "document_positions"


@dataclass(frozen=True)
class TrajectoryBatch:
    """Padded prompt+response sequences and their per-response / per-token annotations.

    Required: ``input_ids`` and ``attention_mask`` ``[B, P+R]``, ``response_mask`` ``[B, R]``
    (bool: which response tokens carry loss), ``group_ids`` and ``sample_ids`` ``[B]`` (int64).
    Optional annotations: ``advantages`` ``[B]`` (one per response) or ``[B, R]``, ``rewards``
    ``[B]``, and the per-token logprob tensors ``rollout_logprobs`` (under the sampler) and
    ``teacher_logprobs`` (a distillation teacher). π_old and the frozen reference are not
    columns: an objective reads them through its ``old_logp_cache`` and the reference network its
    builder received.
    A distillation teacher may add its top-k next-token distribution at every response position:
    ``teacher_topk_ids`` (int64) and ``teacher_topk_logprobs`` ``[B, R, K]``, both or neither.
    ``columns``: what a declared role (``placement/specs.py``) adds under a name that is no
    field here, ``[B]`` or ``[B, R, ...]``; rows are selected, padded and moved with the batch.
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    group_ids: Tensor
    sample_ids: Tensor
    advantages: Tensor | None = None
    rewards: Tensor | None = None
    rollout_logprobs: Tensor | None = None
    teacher_logprobs: Tensor | None = None
    teacher_topk_ids: Tensor | None = None
    teacher_topk_logprobs: Tensor | None = None
    columns: Mapping[str, Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = self.input_ids
        _expect(ids.dim() == 2, "input_ids", f"must be [B, P+R], got shape {tuple(ids.shape)}")
        _expect(
            not ids.is_floating_point() and ids.dtype != torch.bool,
            "input_ids",
            f"must be an integer tensor, got {ids.dtype}",
        )
        b, s = ids.shape
        _expect(
            self.attention_mask.shape == ids.shape,
            "attention_mask",
            f"shape {tuple(self.attention_mask.shape)} != input_ids shape {tuple(ids.shape)}",
        )
        rm = self.response_mask
        _expect(rm.dtype == torch.bool, "response_mask", f"must be bool, got {rm.dtype}")
        _expect(
            rm.dim() == 2 and rm.shape[0] == b and 0 < rm.shape[1] <= s,
            "response_mask",
            f"must be [B={b}, R<= {s}], got {tuple(rm.shape)}",
        )
        r = rm.shape[1]
        for name in ("group_ids", "sample_ids"):
            t = getattr(self, name)
            _expect(t.shape == (b,), name, f"must be [B={b}], got {tuple(t.shape)}")
            _expect(t.dtype == torch.int64, name, f"must be int64, got {t.dtype}")
        if self.advantages is not None:
            a = self.advantages
            _expect(a.is_floating_point(), "advantages", f"must be floating, got {a.dtype}")
            _expect(
                a.shape in ((b,), (b, r)),
                "advantages",
                f"must be [B={b}] or [B={b}, R={r}], got {tuple(a.shape)}",
            )
        if self.rewards is not None:
            _expect(self.rewards.shape == (b,), "rewards", f"must be [B={b}]")
        for name in _PER_TOKEN:
            t = getattr(self, name)
            if t is None:
                continue
            _expect(t.is_floating_point(), name, f"must be floating, got {t.dtype}")
            _expect(t.shape == (b, r), name, f"must be [B={b}, R={r}], got {tuple(t.shape)}")
        self._check_topk(b, r)
        self._check_columns(b, r)

    def _check_columns(self, b: int, r: int) -> None:
        for name, t in self.columns.items():
            where = f"columns[{name!r}]"
            _expect(name not in _FIELDS, where, "is a field of the batch; set the field instead")
            _expect(isinstance(t, Tensor), where, f"must be a tensor, got {type(t).__name__}")
            _expect(
                t.shape[:1] == (b,) and (t.dim() == 1 or t.shape[1] == r),
                where,
                f"must be [B={b}] or [B={b}, R={r}, ...], got {tuple(t.shape)}",
            )

    def _check_topk(self, b: int, r: int) -> None:
        ids, logp = self.teacher_topk_ids, self.teacher_topk_logprobs
        if ids is None and logp is None:
            return
        _expect(ids is not None and logp is not None, "teacher_topk_ids",
                "teacher_topk_ids and teacher_topk_logprobs come together")  # fmt: skip
        _expect(ids.dtype == torch.int64, "teacher_topk_ids", f"must be int64, got {ids.dtype}")
        _expect(
            ids.dim() == 3 and ids.shape[:2] == (b, r) and ids.shape[2] >= 1,
            "teacher_topk_ids",
            f"must be [B={b}, R={r}, K], got {tuple(ids.shape)}",
        )
        _expect(
            logp.is_floating_point(), "teacher_topk_logprobs", f"must be floating, got {logp.dtype}"
        )
        _expect(logp.shape == ids.shape, "teacher_topk_logprobs",
                f"shape {tuple(logp.shape)} != teacher_topk_ids shape {tuple(ids.shape)}")  # fmt: skip

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    def __len__(self) -> int:
        return self.batch_size

    @property
    def response_width(self) -> int:
        return self.response_mask.shape[1]

    @property
    def prompt_width(self) -> int:
        return self.input_ids.shape[1] - self.response_width

    @property
    def response_ids(self) -> Tensor:
        return self.input_ids[:, self.prompt_width :]

    def __getitem__(self, idx: slice | Sequence[int] | Tensor) -> TrajectoryBatch:
        """Select rows; every field is indexed the same way so annotations stay aligned."""
        if isinstance(idx, int):
            idx = [idx]
        if isinstance(idx, Sequence) and not isinstance(idx, Tensor):
            idx = torch.as_tensor(list(idx), dtype=torch.long)
        return self.map(lambda t: t[idx])

    def replace(self, **changes: Tensor | None) -> TrajectoryBatch:
        return dataclasses.replace(self, **changes)

    def map(self, fn) -> TrajectoryBatch:
        """Apply ``fn`` to every tensor field (row selection, ``.to(device)``)."""
        vals = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        vals = {k: v if v is None else fn(v) for k, v in vals.items() if k != "columns"}
        vals["columns"] = {name: fn(t) for name, t in self.columns.items()}
        return TrajectoryBatch(**vals)

    def to(self, device: torch.device | str) -> TrajectoryBatch:
        return self.map(lambda t: t.to(device))


_FIELDS = frozenset(f.name for f in dataclasses.fields(TrajectoryBatch))


def _expect(cond: bool, field: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"TrajectoryBatch.{field}: {msg}")
