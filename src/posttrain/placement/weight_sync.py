"""Weight sync in buckets: from the policy's (possibly sharded) weights into a rollout's own copy.

The policy side (:class:`WeightSource`) plans its weights once into buckets of at most
``placement.sync_bucket_mb`` (a tensor larger than a bucket travels alone) and produces one
bucket per call, so a policy rank never holds more than one bucket beyond its own weights or
shards; a sharded policy gathers a bucket's tensors collectively (every rank calls). The rollout
side (:class:`WeightSink`) feeds each bucket to the engine's weight receiver (in place) and checks,
after the last one, that the sync covered every weight.

What travels:

- **No adapters**: every weight, float32, under the model's own names; tied tensors once.
- **LoRA** (a peft policy): only the adapters, ``<module>.lora_A`` and ``<module>.lora_B``.
  The base weights are frozen, so the rollout's own load already holds them; it keeps a float32
  copy of each adapted weight as loaded (``W0``) and sets ``W0 + (B @ A) * scale`` — the very
  float32 operations :func:`posttrain.model.lora.merged_state` runs on the policy — so the
  rollout's weights, hence its tokens and log-probs, are bit-identical to a sync of merged
  weights. The rollout's forward stays a plain model's (no adapter matmuls while sampling).
  An engine that applies adapters itself (vLLM's LoRA path) takes them unmerged instead.
  ``adapters=False`` sends merged full weights (what an engine that loads plain Hugging Face
  weights needs, ``vllm.lora_sync=merged``; the benchmark compares both).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from posttrain.model.lora import ADAPTER, is_lora
from posttrain.trainer import sharding as sh

if TYPE_CHECKING:
    from posttrain.rollout.base import RolloutEngine

_PEFT_PREFIX = "base_model.model."
_ADAPTER_KEY = re.compile(rf"^(.*)\.lora_([AB])\.{ADAPTER}\.weight$")
LORA_A, LORA_B = ".lora_A", ".lora_B"


def to_wire(bucket: Mapping[str, Tensor]) -> dict[str, Any]:
    """A bucket as numpy arrays that view the tensors: Ray stores numpy arrays without copying
    them (pickle-5 buffers, read back as views of the object store), where a torch tensor is
    pickled in-band (one extra copy to put it, two to get it). A dtype numpy lacks (bfloat16)
    travels as its bytes with its dtype and shape."""
    out: dict[str, Any] = {}
    for name, t in bucket.items():
        t = t.detach()
        try:
            out[name] = t.numpy()
        except TypeError:
            out[name] = (t.contiguous().view(torch.uint8).numpy(), str(t.dtype), tuple(t.shape))
    return out


def from_wire(value: Any) -> Tensor:
    """A tensor over what :func:`to_wire` sent (a read-only view of the store: copy from it)."""
    if isinstance(value, Tensor):
        return value
    with warnings.catch_warnings():  # read-only arrays: the sink only copies out of them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        if isinstance(value, tuple):
            data, dtype, shape = value
            return torch.from_numpy(data).view(getattr(torch, dtype.split(".")[-1])).view(shape)
        return torch.from_numpy(value)


def wire_bytes(value: Any) -> int:
    """Bytes of a tensor, or of its :func:`to_wire` form."""
    if isinstance(value, Tensor):
        return _nbytes(value)
    return int((value[0] if isinstance(value, tuple) else value).nbytes)


def bucket_bytes(mb: float) -> int:
    """``placement.sync_bucket_mb`` in bytes (MiB)."""
    return max(1, int(mb * 2**20))


def plain_name(key: str) -> str:
    """A peft key under the name a plain (un-wrapped) model of the architecture uses."""
    return key.removeprefix(_PEFT_PREFIX).replace(".base_layer.", ".")


@dataclass(frozen=True)
class Unit:
    """Policy state-dict keys gathered and sent together, and the bytes they send."""

    keys: tuple[str, ...]
    nbytes: int


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()  # a DTensor's numel is its global one


def _distinct(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``state`` without the keys that alias an earlier one (tied embeddings travel once).

    Parameters are compared by identity, which every rank of a sharded model agrees on (a
    rank's local shard may be empty, and empty tensors share no storage)."""
    out, seen = {}, set()
    for key, t in state.items():
        if isinstance(t, nn.Parameter):
            ident = id(t)
        else:  # a buffer: by its storage (empty ones share none)
            ident = (t.data_ptr(), t.dtype, t.shape) if t.numel() else key
        if ident not in seen:
            seen.add(ident)
            out[key] = t
    return out


def plan_units(model: nn.Module, adapters: bool) -> list[Unit]:
    """What a sync of ``model`` sends, unit by unit, in state-dict order."""
    state = _distinct(model.state_dict(keep_vars=True))
    lora = {k: m.groups() for k in state if (m := _ADAPTER_KEY.match(k))}
    if adapters:
        stems = dict.fromkeys(stem for stem, _ in lora.values())
        keys = [(f"{s}.lora_A.{ADAPTER}.weight", f"{s}.lora_B.{ADAPTER}.weight") for s in stems]
        return [Unit(k, sum(_nbytes(state[x]) for x in k)) for k in keys]
    units = []
    for key, t in state.items():
        if key in lora:
            continue
        stem = key.removesuffix(".base_layer.weight")
        a, b = f"{stem}.lora_A.{ADAPTER}.weight", f"{stem}.lora_B.{ADAPTER}.weight"
        keys = (key, a, b) if stem != key and a in lora and b in lora else (key,)
        units.append(Unit(keys, _nbytes(t)))
    return units


def plan_buckets(units: Sequence[Unit], limit: int) -> list[list[Unit]]:
    """Consecutive units, at most ``limit`` bytes a bucket (a larger unit is a bucket alone)."""
    buckets: list[list[Unit]] = []
    size = math.inf
    for unit in units:
        if size + unit.nbytes > limit:
            buckets.append([])
            size = 0
        buckets[-1].append(unit)
        size += unit.nbytes
    return buckets


class WeightSource:
    """The policy's side of a sync: ``len(buckets)`` calls of :meth:`bucket` send everything.

    ``adapters`` defaults to sending only the LoRA adapters of a peft model (whose other
    weights are frozen)."""

    def __init__(self, model: nn.Module, limit: int, adapters: bool | None = None) -> None:
        lora = is_lora(model)
        self.adapters = lora if adapters is None else adapters
        if self.adapters:
            trainable = [n for n, p in model.named_parameters() if p.requires_grad]
            frozen_base = lora and all(_ADAPTER_KEY.match(n) for n in trainable)
            if not frozen_base:
                raise ValueError(
                    "an adapter-only weight sync needs a LoRA model whose only trainable "
                    "parameters are its adapters"
                )
        self.model = model
        self.scale = _lora_scale(model) if lora else None
        self.buckets = plan_buckets(plan_units(model, self.adapters), limit)

    @torch.no_grad()
    def bucket(self, k: int, wire: bool = False) -> dict[str, Any]:
        """Bucket ``k`` as CPU tensors under the names the rollout receives (rank 0; other
        ranks of a sharded model take part in the gathers and get ``{}``); ``wire``: in
        :func:`to_wire` form, for the object store."""
        if wire:
            return to_wire(self.bucket(k))
        state = self.model.state_dict(keep_vars=True)
        out: dict[str, Tensor] = {}
        for unit in self.buckets[k]:
            full = {key: sh.gather_to_rank0(state[key]) for key in unit.keys}
            if full[unit.keys[0]] is None:
                continue  # not rank 0: the gathers were this rank's part
            out.update(self._sent(unit, full))
        return out

    def _sent(self, unit: Unit, full: dict[str, Tensor]) -> dict[str, Tensor]:
        if self.adapters:
            a, b = (full[k] for k in unit.keys)
            stem = plain_name(unit.keys[0].removesuffix(f".lora_A.{ADAPTER}.weight"))
            return {stem + LORA_A: a, stem + LORA_B: b}
        key, value = unit.keys[0], full[unit.keys[0]]
        if len(unit.keys) == 3:  # a merged LoRA weight, as merged_state computes it
            a, b = full[unit.keys[1]], full[unit.keys[2]]
            value = value + ((b @ a) * self.scale).to(value.dtype)
        return {plain_name(key): value}


def _lora_scale(model: nn.Module) -> float:
    """peft's adapter scale, read from the adapter layers themselves."""
    import peft

    for module in model.modules():
        if isinstance(module, peft.tuners.lora.LoraLayer):
            return float(module.scaling[ADAPTER])
    raise ValueError("a LoRA model without LoRA layers")


def adapted_modules(model: nn.Module, targets: Sequence[str]) -> list[str]:
    """Names of the linear modules peft adapts for ``targets`` (a name equals a target or ends
    with ``.target``, as peft's ``target_modules`` list matches)."""
    return [
        name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and any(name == t or name.endswith(f".{t}") for t in targets)
    ]


class WeightSink:
    """The rollout's side: feeds buckets to ``engine``'s weight receiver
    (``rollout.base.WeightReceiver``: ``begin``, ``load`` per bucket, ``end``).

    ``base``: for a LoRA policy, the float32 weight of every adapted module as loaded (module
    name -> tensor on the engine's device), and ``scale`` peft's adapter scale; the sink then
    sends ``base + (B @ A) * scale`` for each module whose adapters arrive, so an engine takes
    full weights whichever kind of sync feeds it. A receiver that applies adapters itself
    (``adapter_modules()`` is not None: vLLM's LoRA path) gets them as they are.
    """

    def __init__(
        self, engine: RolloutEngine, base: Mapping[str, Tensor] | None = None, scale: float = 1.0
    ):
        self.receiver = receiver = engine.weight_receiver()
        #: The modules whose adapters the receiver applies itself (None: it takes full weights).
        self.raw_adapters = receiver.adapter_modules()
        self.base = dict(base or {})
        self.scale = scale
        #: Each weight's canonical key: the first key of the storage it shares (tied weights).
        self.canonical = dict(receiver.names())
        self._received: set[str] = set()
        self._adapters = False  # whether this sync sends adapters (else full weights)
        self._open = False  # whether a sync is under way (the receiver has begun)

    def receive(self, bucket: Mapping[str, Any], final: bool) -> None:
        """Apply one bucket (tensors, or their :func:`to_wire` form); after the ``final`` one,
        every weight (or, for adapters, every adapted module) must have arrived in this sync.
        A merged adapter weight is loaded as soon as it is computed, so the rollout holds
        one such weight at a time beyond its own."""
        if not self._open:
            self.receiver.begin()
            self._open = True
        bucket = {name: from_wire(v) for name, v in bucket.items()}
        plain: dict[str, Tensor] = {}
        for name, t in bucket.items():
            if name.endswith(LORA_B):
                continue
            if name.endswith(LORA_A):
                module = name.removesuffix(LORA_A)
                if self.raw_adapters is not None:
                    self.receiver.load({name: t, module + LORA_B: bucket[module + LORA_B]})
                else:
                    merged = self._merged(module, t, bucket[module + LORA_B])
                    self.receiver.load({f"{module}.weight": merged})
                self._received.add(module)
                self._adapters = True
            else:
                plain[name] = t
                self._received.add(self.canonical.get(name, name))
        if final:
            self._open = False
            self._check_complete()
        self.receiver.load(plain)
        if final:
            self.receiver.end()

    @torch.no_grad()
    def _merged(self, module: str, a: Tensor, b: Tensor) -> Tensor:
        if not self.base:
            raise ValueError(
                f"weight sync: adapters arrived for {module}, but this rollout holds no base "
                "weights to merge them onto (its engine takes full weights only); send the "
                "policy's merged weights"
            )
        base = self.base.get(module)
        if base is None:
            raise ValueError(
                f"weight sync: adapters arrived for {module}, which the rollout does not hold as "
                "an adapted module; the rollout and the policy disagree on "
                "model.lora_target_modules"
            )
        a, b = a.to(base.device), b.to(base.device)
        return base + ((b @ a) * self.scale).to(base.dtype)

    def _check_complete(self) -> None:
        if self._adapters:
            expected = set(self.base if self.raw_adapters is None else self.raw_adapters)
        else:
            expected = set(self.canonical.values())
        missing = sorted(expected - self._received)
        self._received, self._adapters = set(), False
        if missing:
            raise ValueError(
                f"weight sync: {len(missing)} weight(s) did not arrive (first: {missing[0]}); "
                "the policy and the rollout load different models"
            )
