"""bf16 copies of the frozen linear weights, swapped in for the length of a bf16 autocast forward.

Autocast caches the bf16 cast of a weight only for a leaf that requires grad, and only until
the region ends, so a frozen weight (a LoRA base layer, the tied head) is cast again in every
forward of every micro-batch, and the cast is kept for the backward. On SmolLM2 with LoRA in
bf16 those casts were the largest item of the update (``aten::copy_`` 30% of its CPU time,
``benchmarks/update_phases.py --bf16 --profile``). A frozen weight does not change between
forwards, so it is cast once here and reused.

Exactness: the cast is round-to-nearest whoever does it, and autocast passes a bf16 tensor
through unchanged, so every forward, backward and gradient is bit for bit the one autocast
computes (``tests/test_frozen_casts.py``). Outside the region the modules hold their float32
weights again: checkpoints, weight syncs, merges and exports never see the copies. The copies
live for one collected batch (the trainer calls :meth:`FrozenCasts.clear` at its end), so they
do not sit in memory through the rollout, and a weight changed between updates by any means is
cast afresh; within one batch a copy is also renewed when its weight is replaced or changed in
place through autograd-visible ops (its storage or version counter moved). A write through
``.data`` inside one update (peft's ``merge``, which nothing here calls) would not be seen.
With gradient checkpointing the trainer does not use them: the recomputed forwards run outside
the region and cast anyway, and the copies would hold every layer's cast at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


class FrozenCasts:
    """For ``model``'s ``nn.Linear`` modules whose weight is a frozen float32 tensor."""

    def __init__(self, model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
        self.model = model
        self.dtype = dtype
        #: id(weight) -> (the weight, its storage, its version, the copy)
        self._copies: dict[int, tuple[nn.Parameter, int, int, nn.Parameter]] = {}
        self._inside = False

    def clear(self) -> None:
        """Drop every copy (the end of a collected batch)."""
        self._copies.clear()

    def _frozen(self) -> Iterator[nn.Linear]:
        for module in self.model.modules():
            w = module._parameters.get("weight") if isinstance(module, nn.Linear) else None
            if w is not None and not w.requires_grad and w.dtype == torch.float32:
                yield module

    def _copy(self, weight: nn.Parameter) -> nn.Parameter:
        held = self._copies.get(id(weight))
        if (
            held is None
            or held[0] is not weight
            or held[1:3] != (weight.data_ptr(), weight._version)
        ):
            cast = nn.Parameter(weight.detach().to(self.dtype), requires_grad=False)
            held = (weight, weight.data_ptr(), weight._version, cast)
            self._copies[id(weight)] = held
        return held[3]

    @contextlib.contextmanager
    def swapped(self) -> Iterator[None]:
        """The frozen linears hold their bf16 copies inside, their own weights after (a region
        entered again from inside changes nothing)."""
        if self._inside:
            yield
            return
        swaps = [(m, m._parameters["weight"]) for m in self._frozen()]
        live = {id(w) for _, w in swaps}
        for gone in set(self._copies) - live:  # a weight replaced since: drop its copy
            del self._copies[gone]
        self._inside = True
        try:
            for module, weight in swaps:
                module._parameters["weight"] = self._copy(weight)
            yield
        finally:
            for module, weight in swaps:
                module._parameters["weight"] = weight
            self._inside = False


def bf16_region(device_type: str, casts: FrozenCasts | None) -> contextlib.AbstractContextManager:
    """bf16 autocast with ``casts``' copies swapped in (None: autocast alone); a swap that fails
    on entry leaves no autocast behind."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.autocast(device_type=device_type, dtype=torch.bfloat16))
        if casts is not None:
            stack.enter_context(casts.swapped())
        return stack.pop_all()
