"""Sharded policy ranks through PyTorch's own FSDP2 (``fully_shard``).

``placement.policy_sharding=fsdp`` wraps each decoder layer and then the root in
``fully_shard``: every rank keeps 1/N of each parameter, gradient and AdamW moment, gathers a
layer's parameters just before it runs and frees them after (forward and backward), and
reduce-scatters the layer's gradient as soon as it is computed.

What changes for the trainer, and why the update stays the single-process one:

- Gradients are reduce-scattered as a **sum** (divide factor 1), exactly what the replicated
  path's hand-written all-reduce produces; the TOKEN_SUM division by the global weight then runs
  on the shards. No averaging over ranks sneaks in.
- Every forward and backward is a collective, so ranks must run the same number of them. Ranks
  may hold different numbers of rows, hence of micro-batches; :func:`lockstep_ghosts` tells a rank
  how many extra *ghost* passes to run (a copy of one of its own rows whose loss is multiplied by
  zero: its gradient is exactly zero and its metrics are dropped).
- Norms and finiteness checks are computed on the local shards and summed over ranks.
- ``model.dtype=bfloat16`` becomes FSDP's ``MixedPrecisionPolicy`` (parameters gathered in bf16,
  gradients reduced in float32, float32 master shards) instead of autocast.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from posttrain.trainer import distributed as dp

POLICY_SHARDINGS = ("none", "fsdp")


def local(t: Tensor) -> Tensor:
    """This rank's part of ``t``: the local shard of a DTensor, ``t`` itself otherwise."""
    return t.to_local() if isinstance(t, DTensor) else t


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face model (peft-wrapped or not), in order.

    They are the modules whose class the model declares unsplittable (``_no_split_modules``),
    which is how Hugging Face itself finds the unit of sharding.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"placement.policy_sharding=fsdp needs a Hugging Face model that declares its decoder "
            f"layers (_no_split_modules); {type(base).__name__} declares none"
        )
    return layers


def on_meta(model: nn.Module) -> bool:
    """Whether ``model``'s parameters are on the meta device (a skeleton without weights)."""
    return any(p.is_meta for p in model.parameters())


def shard_model(model: nn.Module, precision: str) -> None:
    """``fully_shard`` each decoder layer, then the root, over the default process group, and
    fill every rank's shards from rank 0's weights.

    Rank 0 holds the real model; any other rank may hold a skeleton on the meta device
    (``load_policy(..., skeleton=True)``), which never allocates the full weights: it allocates
    its shards only, and fills them from rank 0's tensors as they are broadcast, one at a time.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dp.is_distributed():
        raise ValueError(
            "placement.policy_sharding=fsdp needs a torch.distributed group (placement.backend=ray "
            "starts one for the policy ranks)"
        )
    if dp.rank() == 0 and on_meta(model):
        raise ValueError("policy rank 0 must hold the real weights (it sends them to the others)")
    # References to rank 0's full tensors (no copy), kept until every rank has its shards.
    full = model.state_dict() if dp.rank() == 0 else {}
    device = dp.collective_device()
    mesh = init_device_mesh(device.type, (dp.world_size(),))
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if precision == "bfloat16"
        else MixedPrecisionPolicy()
    )
    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    # The root reshards too (its default keeps the embeddings gathered between a forward and the
    # backward, which a scoring forward without backward, like π_old's, would leave gathered).
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    for module in [*layers, model]:
        # Sum, as the replicated path's all-reduce does; TOKEN_SUM divides once afterwards.
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    _fill_from_rank0(model, full, device)


def place_frozen(
    models: Sequence[nn.Module],
    policy: nn.Module,
    device: torch.device,
    sharded: bool,
    precision: str,
) -> None:
    """A trainer's auxiliary models (a frozen reference): frozen, in eval mode, on ``device``;
    sharded like the policy when it is (:func:`shard_model`: a reference then costs each rank
    1/N of its bytes, and a reset copies shard to shard)."""
    own = {id(p) for p in policy.parameters()}
    for i, aux in enumerate(models):
        if aux is policy or any(id(p) in own for p in aux.parameters()):
            raise ValueError(
                f"auxiliary_models[{i}] shares parameters with the policy; a frozen "
                "reference must be a separate copy (e.g. copy.deepcopy(policy))"
            )
        if on_meta(aux) and not sharded:
            raise ValueError(f"auxiliary_models[{i}] is on the meta device and not sharded")
        aux.requires_grad_(False)
        if sharded:
            shard_model(aux, precision)  # rank 0's weights onto every rank's shards
        else:
            aux.to(device)
        aux.eval()


@torch.no_grad()
def _fill_from_rank0(model: nn.Module, full: dict[str, Tensor], device: torch.device) -> None:
    """Rank 0's parameters and buffers onto every rank: parameters through DCP's broadcast into
    the shards (a meta rank allocates its empty shards first), then every buffer whole (the
    non-persistent ones, such as rotary frequencies, are in no state dict)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if on_meta(model):
        # Only this rank's shards (and the small buffers) are allocated; tied parameters stay
        # one parameter, which loading with assign=True would split.
        model.to_empty(device=device)
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=opts)
    for buf in model.buffers():
        moved = buf.to(device)
        dist.broadcast(moved, src=0)
        buf.copy_(moved)


def lockstep_ghosts(passes: int) -> int:
    """How many ghost passes this rank adds so that every rank runs the most ranks' ``passes``."""
    (most,) = dp.all_reduce_floats([passes], "max")
    return int(most) - passes


def ghost_rows(chunks: Sequence, fallback=None):
    """A batch for ghost passes: the rows of this rank's first group in its first chunk (any
    real rows will do; a whole group, so an objective that reads groups, such as DPO's pairs,
    sees one)."""
    source = chunks[0] if chunks else fallback
    if source is None or len(source) == 0:
        raise ValueError(
            "placement.policy_sharding=fsdp: a policy rank received no rows; every rank needs at "
            "least one row per mini-batch (raise the rows of a step or lower policy_ranks)"
        )
    ids = getattr(source, "group_ids", None)
    if ids is None:
        return source[0:1]
    return source[torch.nonzero(ids == ids[0]).flatten()]


@torch.no_grad()
def grad_norm_(params: Sequence[nn.Parameter], max_norm: float) -> float:
    """Global L2 norm of the (sharded) gradients; clips them to ``max_norm`` when it is > 0.

    The clip coefficient is ``torch.nn.utils.clip_grad_norm_``'s: max_norm / (norm + 1e-6),
    applied only when below 1.
    """
    grads = [local(p.grad) for p in params if p.grad is not None]
    sq = sum(float(g.double().pow(2).sum()) for g in grads)
    (total,) = dp.all_reduce_floats([sq])
    norm = math.sqrt(total)
    if max_norm > 0 and math.isfinite(norm):
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            torch._foreach_mul_(grads, coef)
    return norm


@torch.no_grad()
def all_finite(tensors: Iterable[Tensor]) -> bool:
    """Whether every rank's shards of ``tensors`` are finite (one collective)."""
    ok = all(bool(torch.isfinite(local(t)).all()) for t in tensors)
    (bad,) = dp.all_reduce_floats([0.0 if ok else 1.0], "max")
    return bad == 0.0


def shard_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This rank's bytes of parameters, gradients and optimizer state, from the tensors' sizes
    (local shards only: what the rank holds)."""

    def size(t: Tensor) -> int:
        t = local(t)
        return t.numel() * t.element_size()

    params = list({id(p): p for p in model.parameters()}.values())
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, Tensor)]
    return {
        "params": sum(size(p) for p in params),
        "grads": sum(size(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(size(v) for v in state if v.ndim > 0),
    }


@torch.no_grad()
def gather_to_rank0(t: Tensor) -> Tensor | None:
    """The whole of ``t`` on the CPU on rank 0, ``None`` on the other ranks.

    A DTensor is all-gathered (a collective: every rank calls this for the same tensors in the
    same order); each rank then holds the full tensor only until it returns, so a weight sync
    that gathers one bucket at a time never holds more than that bucket beyond its shards. A
    plain tensor is this rank's own: on the CPU it is returned as it is (a view, no copy).
    """
    full = t.full_tensor() if isinstance(t, DTensor) else t
    return full.detach().cpu() if dp.rank() == 0 else None
