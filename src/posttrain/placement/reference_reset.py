"""``rl.reference_reset_every``: the KL reference periodically becomes a copy of the policy.

ProRL's reference reset (TRL's ``sync_ref_model``): after the update of every step ``s`` with
``s % N == 0`` the reference takes the policy's current weights and stays frozen until the next
reset; ``rl.reset_optimizer`` also clears the optimizer's state then (the learning-rate schedule
goes on), so the two effects can be told apart.

The reference scores on the policy side (a data-side reference is refused in preflight), so a
lag changes nothing here: the batch trained at step ``t > s`` is scored against the policy after
step ``s``, whichever older weights sampled it.

Full fine-tuning: the reference is the run's own frozen load (``model.dtype``); a reset copies
the policy's float32 weights into it. Under FSDP the trainer shards the reference as it shards
the policy (the same units over the same ranks), so each rank copies its own shards: no gather,
and 1/N of the reference's bytes per rank. LoRA: the reference is the policy's module scored
with a frozen copy of the adapters (:class:`ResettableAdapterReference`; before the first reset
the adapters are off, the frozen base, exactly as without resets).

Exact resume: :meth:`ReferenceReset.state_dict` (the step, the reset count and, after a reset,
the reference's weights — the adapters only under LoRA) rides in the trainer's ``trainer.pt``,
which the checkpoint manifest covers. Under FSDP the reference's weights (a full reference's
shards, or LoRA's frozen adapter shards) ride in the checkpoint's DCP shards instead
(:meth:`ReferenceReset.dcp_tensors`), resharded on load like the policy's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from posttrain.model.lora import is_lora
from posttrain.trainer import sharding as sh

#: The policy's KL metric (the GRPO objective's ``kl_ref``, public name).
KL_METRIC = "train/pg/kl_ref"


class ResettableAdapterReference(nn.Module):
    """The LoRA policy scored with a frozen copy of its adapters (eval mode, no grad); before
    the first :meth:`freeze` the adapters are off: the frozen base.

    It holds the policy module itself. Unsharded, the frozen adapters go in through
    ``functional_call``, so the policy's parameters are never written. Under FSDP a layer
    gathers its own parameter shards and would never read a tensor passed that way, so the
    frozen shards are copied into the policy's adapter shards for the forward and the live
    ones back after it (exact copies under no grad; FSDP gathers the restored shards again for
    the update's backward)."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        if not is_lora(policy):
            raise ValueError("ResettableAdapterReference needs a peft (LoRA) model")
        self.policy = policy
        self.frozen: dict[str, Tensor] | None = None  # allocated at the first reset or load
        self.active = False  # a reset has happened: score with ``frozen``, not the base

    def _adapters(self) -> dict[str, Tensor]:
        return {n: p for n, p in self.policy.named_parameters() if p.requires_grad}

    def storage(self) -> dict[str, Tensor]:
        """The frozen adapters' tensors, allocated on first use (as the live ones are: sharded
        alike under FSDP), which a reset and a checkpoint's load write in place."""
        if self.frozen is None:
            self.frozen = {n: p.detach().clone() for n, p in self._adapters().items()}
        return self.frozen

    @torch.no_grad()
    def freeze(self) -> None:
        """Take the policy's current adapters (its trainable parameters) as the reference's."""
        live = self._adapters()
        for name, tensor in self.storage().items():
            sh.local(tensor).copy_(sh.local(live[name]))
        self.active = True

    def forward(self, **inputs):
        was_training = self.policy.training
        self.policy.eval()
        try:
            if not self.active:
                with self.policy.disable_adapter():
                    return self.policy(**inputs)
            if sh.is_sharded(self.policy):
                return self._swapped_forward(inputs)
            return functional_call(self.policy, self.frozen, args=(), kwargs=inputs)
        finally:
            self.policy.train(was_training)

    def _swapped_forward(self, inputs: dict[str, Any]):
        live = {n: sh.local(p) for n, p in self._adapters().items()}
        kept = {n: t.clone() for n, t in live.items()}
        with torch.no_grad():
            for name, tensor in self.storage().items():
                live[name].copy_(sh.local(tensor))
        try:
            return self.policy(**inputs)
        finally:
            with torch.no_grad():
                for name, tensor in kept.items():
                    live[name].copy_(tensor)


class ReferenceReset:
    """Counts the policy's steps and resets ``reference`` every ``every`` of them."""

    def __init__(
        self,
        policy: nn.Module,
        reference: nn.Module,
        optimizer: torch.optim.Optimizer,
        every: int,
        reset_optimizer: bool,
    ) -> None:
        if every < 1:
            raise ValueError(f"reference resets need every >= 1, got {every}")
        self.policy, self.reference, self.optimizer = policy, reference, optimizer
        self.every, self.reset_optimizer = every, reset_optimizer
        self.step = 0
        self.resets = 0
        self._after_reset = False  # the next step's KL is the first against the new reference

    def after_update(self, metrics: dict[str, float]) -> dict[str, float]:
        """Call once per RL step, after its update; returns the step's reset metrics."""
        self.step += 1
        out: dict[str, float] = {}
        kl = metrics.get(KL_METRIC)
        if self._after_reset and kl is not None:
            out["train/reference/kl_after_reset"] = kl
        self._after_reset = False
        if self.step % self.every == 0:
            self._reset()
            if kl is not None:
                out["train/reference/kl_before_reset"] = kl
            self._after_reset = True
        out["train/reference/resets"] = float(self.resets)
        return out

    @torch.no_grad()
    def _reset(self) -> None:
        if isinstance(self.reference, ResettableAdapterReference):
            self.reference.freeze()
        else:  # sharded alike under FSDP: each rank's shard from its own shard
            source = self.policy.state_dict()
            for name, tensor in self.reference.state_dict().items():
                sh.local(tensor).copy_(sh.local(source[name]))
        if self.reset_optimizer:
            self.optimizer.state.clear()
        self.resets += 1

    # -- state (in trainer.pt, or DCP for a sharded trainer) -----------------------------------
    def dcp_tensors(self) -> dict[str, Tensor]:
        """The reference's weights (LoRA: the frozen adapters), where a checkpoint keeps them in
        DCP (a sharded trainer's, or one loaded from it), else in ``trainer.pt``: the same
        tensors whatever the reset count, so a load asks for what any save wrote, and DCP fills
        them in place (``trainer/dcp.py``)."""
        if isinstance(self.reference, ResettableAdapterReference):
            return dict(self.reference.storage())
        return dict(self.reference.state_dict())

    def state_dict(self) -> dict[str, Any]:
        sharded = sh.is_sharded(self.policy)  # then the weights are in the DCP shards
        weights = self.dcp_tensors() if self.resets and not sharded else {}
        return {
            "step": self.step,
            "resets": self.resets,
            "after_reset": self._after_reset,
            "weights": weights,
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.resets = int(state["resets"])
        self._after_reset = bool(state["after_reset"])
        weights = state["weights"]  # empty: none yet, or in the DCP shards (already loaded)
        if isinstance(self.reference, ResettableAdapterReference):
            if weights:
                self.reference.frozen = {n: t.clone() for n, t in weights.items()}
            self.reference.active = self.resets > 0
        elif weights:
            self.reference.load_state_dict(weights)
