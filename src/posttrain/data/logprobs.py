"""Per-token logprobs (and entropies) of response tokens under a causal LM.

The logits of a batch are ``[B, R, V]``; they and their float32 copy are the largest tensors of an
RL step for a model with a large vocabulary. Two bounds keep them small: above
:data:`LOGIT_CHUNK_ELEMENTS` the head runs per chunk of rows (:func:`response_logprobs`), and
scoring already-computed logits runs over chunks of about :data:`CHUNK_ELEMENTS` logits, so only
one chunk's float32 copy and softmax temporaries exist at a time. The log-prob's gradient is its
closed form, written chunk by chunk from the kept logsumexp (:class:`_TokenLogprobs`): no
softmax is stored for the backward and no forward is recomputed in it.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from posttrain.data.padding import pad_responses, trim_padding
from posttrain.data.prefix import position_ids_from_mask, shared_outputs, should_share
from posttrain.data.trajectory import DOCUMENT_POSITIONS, TrajectoryBatch

#: Logits per chunk (positions x vocabulary): 2**24 is 64 MiB per float32 temporary.
CHUNK_ELEMENTS = 2**24

EntropyMode = Literal["metric", "grad"]


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return logits / temperature if temperature != 1.0 else logits


def _chunk_entropy(logits: Tensor, temperature: float) -> Tensor:
    # H = -sum p log p = logsumexp(x) - sum p x, with p = softmax(x).
    x = _scaled(logits, temperature)
    return torch.logsumexp(x, dim=-1) - (torch.softmax(x, dim=-1) * x).sum(-1)


def _run(fn, *args: Tensor) -> Tensor:
    if torch.is_grad_enabled() and args[0].requires_grad:
        return checkpoint(fn, *args, use_reentrant=False)
    return fn(*args)


def _rows(width: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, width))


class _TokenLogprobs(torch.autograd.Function):
    """``x[y] - logsumexp(x)`` over rows of ``[N, V]`` logits (``x = logits / T``), optionally with
    the entropy of ``softmax(x)`` as a metric (no gradient), both from one logsumexp per chunk.

    Its backward is the closed form ``(onehot(y) - softmax(x)) * g / T``, written chunk by chunk
    into one ``[N, V]`` gradient: it keeps only the logsumexp per row (no softmax temporaries,
    no recomputed forward, no full-size zero tensors per chunk as slicing's backward makes).
    """

    @staticmethod
    def forward(ctx, logits, targets, temperature: float, entropy: bool):
        n, step = logits.shape[0], _rows(logits.shape[-1])
        dtype = torch.promote_types(logits.dtype, torch.float32)  # what _scaled computes in
        lse = torch.empty(n, dtype=dtype, device=logits.device)
        logp = torch.empty_like(lse)
        ent = torch.empty_like(lse) if entropy else lse.new_empty(0)
        for s in range(0, n, step):
            x = _scaled(logits[s : s + step], temperature)
            e = s + x.shape[0]
            if entropy:  # one exp pass serves both: H = lse - sum(exp(x - m) x) / sum(exp(x - m))
                m = x.amax(-1, keepdim=True).nan_to_num_(0.0, 0.0, 0.0)
                z = torch.exp(x - m)
                total = z.sum(-1)
                lse[s:e] = m.squeeze(-1) + total.log()
                ent[s:e] = lse[s:e] - torch.linalg.vecdot(z, x) / total
            else:
                lse[s:e] = torch.logsumexp(x, dim=-1)
            logp[s:e] = torch.gather(x, -1, targets[s:e].unsqueeze(-1)).squeeze(-1) - lse[s:e]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _grad_ent):
        logits, targets, lse = ctx.saved_tensors
        t = ctx.temperature
        grad = torch.empty_like(logits)
        g = grad_logp.to(lse.dtype) / t
        step = _rows(logits.shape[-1])
        for s in range(0, logits.shape[0], step):
            x = _scaled(logits[s : s + step], t)
            e = s + x.shape[0]
            chunk = torch.exp(x - lse[s:e, None]).mul_(-g[s:e, None])
            chunk.scatter_add_(-1, targets[s:e].unsqueeze(-1), g[s:e, None])
            grad[s:e] = chunk
        return grad, None, None, None


def _score(
    logits: Tensor, targets: Tensor, temperature: float, entropy: EntropyMode | None
) -> tuple[Tensor, Tensor | None]:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if entropy not in (None, "metric", "grad"):
        raise ValueError(f"entropy must be None, 'metric' or 'grad', got {entropy!r}")
    flat, tgt = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    logp, ent = _TokenLogprobs.apply(flat, tgt, temperature, entropy == "metric")
    ent = None if entropy is None else ent
    if entropy == "grad":  # an entropy bonus: its own checkpointed pass keeps the graph
        step = _rows(flat.shape[-1])
        ents = [_run(lambda x: _chunk_entropy(x, temperature), flat[s : s + step])
                for s in range(0, flat.shape[0], step)]  # fmt: skip
        ent = torch.cat([_scaled(flat[:0, 0], 1.0), *ents])
    logp = logp.reshape(targets.shape)
    return logp, None if ent is None else ent.reshape(targets.shape)


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """``log_softmax(logits / temperature)`` gathered at ``targets`` (chunked; module doc)."""
    return _score(logits, targets, temperature, None)[0]


def token_logprobs_and_entropy(
    logits: Tensor, targets: Tensor, temperature: float, entropy: EntropyMode
) -> tuple[Tensor, Tensor]:
    """Logprobs at ``targets`` and the entropy of ``softmax(logits / temperature)`` at every
    position (both shaped like ``targets``), in one chunked pass.

    ``entropy="metric"`` computes it without a gradient; ``"grad"`` keeps its graph (an
    entropy bonus in the loss).
    """
    logp, ent = _score(logits, targets, temperature, entropy)
    if ent is None:
        raise ValueError("entropy must be 'metric' or 'grad'")
    return logp, ent


#: Above this many logit elements (rows x response tokens x vocabulary) per forward, log-probs
#: are computed in row chunks whose logits are recomputed in the backward instead of stored.
LOGIT_CHUNK_ELEMENTS = 1 << 26

#: Config attributes that make an HF head more than ``lm_head(hidden)`` (soft-capping, scaling).
_HEAD_MODIFIERS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def _forward_kwargs(batch: TrajectoryBatch) -> dict:
    packed = batch.columns.get(DOCUMENT_POSITIONS)
    if packed is not None:  # positions restart per document: transformers masks across them
        prompt = torch.arange(batch.prompt_width, device=packed.device).expand(len(batch), -1)
        positions = torch.cat([prompt, packed], dim=1)
        return dict(input_ids=batch.input_ids, position_ids=positions, use_cache=False)
    return dict(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=position_ids_from_mask(batch.attention_mask),
        use_cache=False,
    )


def response_outputs(model: nn.Module, batch: TrajectoryBatch, field: str) -> Tensor:
    """``[B, R, X]`` outputs that predict each response token (row ``t`` predicts token ``t``):
    ``field="logits"`` of the causal LM, or ``"last_hidden_state"`` of its decoder.

    The one forward every scorer runs (policy, reference, π_old, teacher). Where
    ``rl.shared_prefix`` allows it each distinct prompt is encoded once (``data.prefix``);
    otherwise the full sequences run, asking for the last ``R + 1`` logit rows only
    (``logits_to_keep``): the row before the first response token through the last one.
    """
    groups = should_share(model, batch)
    logits = field == "logits"
    module = model if logits else model.get_decoder()
    if groups is not None:
        return shared_outputs(module, batch, groups, field)
    r = batch.response_width
    out = module(**_forward_kwargs(batch), **({"logits_to_keep": r + 1} if logits else {}))
    return getattr(out, field)[:, -(r + 1) : -1, :]


def response_logits(model: nn.Module, batch: TrajectoryBatch) -> Tensor:
    """``[B, R, V]`` logits that predict each response token (:func:`response_outputs`)."""
    return response_outputs(model, batch, "logits")


def response_logprobs(
    model: nn.Module,
    batch: TrajectoryBatch,
    temperature: float = 1.0,
    chunk_elements: int = LOGIT_CHUNK_ELEMENTS,
) -> Tensor:
    """``[B, R]`` logprobs of each response token given everything before it.

    When the response logits would exceed ``chunk_elements`` and the model's head is a plain
    linear layer (and not FSDP-sharded), the decoder runs once and the head + log-softmax run
    per chunk of rows under activation checkpointing: the full-vocab logits (and their float32
    copy) never exist for the whole batch at once.
    """
    return _response_scores(model, batch, temperature, None, chunk_elements)[0]


def masked_response_logprobs(
    model: nn.Module, batch: TrajectoryBatch, chunk_elements: int = LOGIT_CHUNK_ELEMENTS
) -> Tensor:
    """``[B, R]`` logprobs of the response tokens ``batch.response_mask`` marks, 0 elsewhere.

    For a loss that reads a few positions of each row (SFT's assistant tokens, a sixth of a
    tool-use row) the head and log-softmax run at those positions only: the vocabulary-wide
    logits, most of a small model's step, shrink with the mask. Exact: the positions left out
    carry no gradient in such a loss. A head that is not a plain linear layer, or a model
    FSDP-sharded at its root (whose forward must gather the head), scores every position
    (:func:`response_logprobs`) and zeroes the rest.
    """
    head = _plain_head(model)
    if head is None:
        logp = response_logprobs(model, batch, chunk_elements=chunk_elements)
        return logp.masked_fill(~batch.response_mask, 0.0)
    trimmed = trim_padding(batch)
    mask = trimmed.response_mask
    hidden = response_outputs(model, trimmed, "last_hidden_state")[mask]
    targets = trimmed.response_ids[mask]
    if hidden.shape[0] == 0:  # nothing trained in this batch
        return torch.zeros(batch.response_mask.shape, device=hidden.device)
    rows = max(1, chunk_elements // head.out_features)
    flat, _ = _head_in_chunks(hidden, head, targets, rows, 1.0, None)
    logp = torch.zeros(mask.shape, dtype=flat.dtype, device=flat.device).masked_scatter(mask, flat)
    return pad_responses(logp, batch.response_width)


def response_logprobs_and_entropy(
    model: nn.Module,
    batch: TrajectoryBatch,
    temperature: float,
    entropy: EntropyMode,
    chunk_elements: int = LOGIT_CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor]:
    """``[B, R]`` logprobs and policy entropies at each response position, from one forward
    (chunked like :func:`response_logprobs`)."""
    logp, ent = _response_scores(model, batch, temperature, entropy, chunk_elements)
    if ent is None:
        raise ValueError("entropy must be 'metric' or 'grad'")
    return logp, ent


def _response_scores(
    model: nn.Module,
    batch: TrajectoryBatch,
    temperature: float,
    entropy: EntropyMode | None,
    chunk_elements: int,
) -> tuple[Tensor, Tensor | None]:
    # Columns that are padding in every row are dropped (exact; data/padding.py), and the
    # scores padded back to the batch's response width.
    width = batch.response_width
    logp, ent = _trimmed_scores(model, trim_padding(batch), temperature, entropy, chunk_elements)
    return pad_responses(logp, width), None if ent is None else pad_responses(ent, width)


def _trimmed_scores(
    model: nn.Module,
    batch: TrajectoryBatch,
    temperature: float,
    entropy: EntropyMode | None,
    chunk_elements: int,
) -> tuple[Tensor, Tensor | None]:
    r = batch.response_width
    head = _plain_head(model)
    per_row = max(1, r * head.out_features) if head is not None else 0
    rows = max(1, chunk_elements // per_row) if per_row else batch.batch_size
    if rows >= batch.batch_size:
        return _score(response_logits(model, batch), batch.response_ids, temperature, entropy)
    hidden = response_outputs(model, batch, "last_hidden_state")
    return _head_in_chunks(hidden, head, batch.response_ids, rows, temperature, entropy)


def _head_in_chunks(
    hidden: Tensor,
    head: nn.Linear,
    targets: Tensor,
    rows: int,
    temperature: float,
    entropy: EntropyMode | None,
) -> tuple[Tensor, Tensor | None]:
    """The head + log-softmax over ``rows`` leading entries of ``hidden`` at a time, each chunk
    recomputed in the backward (checkpointed) so only one chunk's logits are ever held."""
    fn = functools.partial(_head_scores, temperature=temperature, entropy=entropy)
    grad = torch.is_grad_enabled()
    logps, ents = [], []
    for s in range(0, hidden.shape[0], rows):
        args = (hidden[s : s + rows], head.weight, head.bias, targets[s : s + rows])
        logp, ent = checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args)
        logps.append(logp)
        ents.append(ent)
    return torch.cat(logps), None if entropy is None else torch.cat(ents)


def _head_scores(hidden, weight, bias, targets, *, temperature, entropy):
    return _score(F.linear(hidden, weight, bias), targets, temperature, entropy)


def _fsdp_root(model: nn.Module) -> bool:
    """Whether ``model`` is FSDP-sharded at its root (``trainer/sharding.py``): the parameters
    outside the decoder layers (embeddings, final norm, head) are gathered by the root's own
    forward, so calling its decoder or head directly would meet bare shards."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _plain_head(model: nn.Module) -> nn.Linear | None:
    """The output layer when logits are exactly ``head(decoder(x).last_hidden_state)``."""
    get_head, get_decoder = (
        getattr(model, n, None) for n in ("get_output_embeddings", "get_decoder")
    )
    if get_head is None or get_decoder is None or hasattr(model, "_orig_mod"):
        return None  # a torch.compile wrapper owns the whole forward; don't bypass it
    if _fsdp_root(model):  # its forward gathers the embeddings and head; don't bypass it
        return None
    config = getattr(model, "config", None)
    if any(getattr(config, a, None) not in (None, 1, 1.0) for a in _HEAD_MODIFIERS):
        return None
    head = get_head()
    return head if type(head) is nn.Linear else None
