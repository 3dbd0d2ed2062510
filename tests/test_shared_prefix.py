"""Shared-prefix forwards (each distinct prompt encoded once) equal the full-sequence forwards.

float32 on the ``tiny`` and ``small`` presets: logprobs to 1e-5 absolute, gradients and three
GRPO steps to 1e-5 relative; left-padded prompts of different lengths, groups split across
micro-batches, LoRA, the adapter-free reference and an OPD teacher included.
"""

from __future__ import annotations

import copy
import logging
from types import SimpleNamespace

import pytest
import torch
from transformers import (
    DynamicCache,
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from posttrain.algorithm.grpo import make_objective
from posttrain.config import load_config
from posttrain.config.rl import RLConfig
from posttrain.data import logprobs as lp
from posttrain.data import prefix
from posttrain.data.padding import trim_padding
from posttrain.data.prefix import SharedPrefixUnsupported, prompt_groups, use_shared_prefix
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.model.lora import AdapterFreeReference, apply_lora
from posttrain.model.tiny import build_tiny_model, tiny_config
from posttrain.placement.dispatch import shard_batch
from posttrain.trainer import LLMTrainer
from posttrain.trainer.accumulate import (
    accumulate_gradients,
    group_chunks,
    group_order,
    row_chunks,
    split_evenly,
)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model(preset: str = "tiny", seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(preset)).float()


def grouped_batch(vocab: int, groups=4, n=3, p=9, r=6, seed=0, order=None) -> TrajectoryBatch:
    """``groups`` prompts of different lengths (left-padded to ``p``), ``n`` responses each of
    random lengths (right-padded to ``r``, one possibly empty); rows in ``order`` if given."""
    g = torch.Generator().manual_seed(seed)
    ids, mask, rmask = [], [], []
    for k in range(groups):
        length = 1 + (k * 3) % p  # 1, 4, 7, ...: different paddings in one batch
        prompt = torch.randint(3, vocab, (length,), generator=g)
        for _ in range(n):
            m = int(torch.randint(0, r + 1, (1,), generator=g))
            row = torch.zeros(p + r, dtype=torch.long)
            att = torch.zeros(p + r, dtype=torch.long)
            row[p - length : p], att[p - length : p] = prompt, 1
            row[p : p + m], att[p : p + m] = torch.randint(3, vocab, (m,), generator=g), 1
            ids.append(row)
            mask.append(att)
            rmask.append(torch.arange(r) < m)
    b = groups * n
    batch = TrajectoryBatch(
        input_ids=torch.stack(ids),
        attention_mask=torch.stack(mask),
        response_mask=torch.stack(rmask),
        group_ids=torch.arange(b) // n,
        sample_ids=torch.arange(b),
        advantages=torch.randn(b, generator=g),
    )
    return batch if order is None else batch[list(order)]


def _scores(model, batch, mode, **kw):
    """Logprobs, entropies and the gradient of a weighted sum of both, under ``mode``."""
    model.zero_grad()
    with use_shared_prefix(mode):
        logp, ent = lp.response_logprobs_and_entropy(model, batch, 0.7, "grad", **kw)
    w = torch.linspace(-1, 1, logp.numel()).view_as(logp) * batch.response_mask
    ((logp + 0.1 * ent) * w).sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return logp.detach(), ent.detach(), grads


def _close_rel(a: list[torch.Tensor], b: list[torch.Tensor], rel: float) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert (x - y).norm() <= rel * y.norm() + 1e-12, float((x - y).norm() / y.norm())


def test_prompt_groups_are_the_distinct_prompts_in_order_of_first_row():
    batch = grouped_batch(20, groups=3, n=2, order=[4, 0, 2, 1, 5, 3])  # groups 2 0 1 0 2 1
    groups = prompt_groups(batch)
    assert groups.first.tolist() == [0, 1, 2]
    assert groups.inverse.tolist() == [0, 1, 2, 1, 0, 2]


@pytest.mark.parametrize("preset", ["tiny", "small"])
@pytest.mark.parametrize("chunk_elements", [lp.LOGIT_CHUNK_ELEMENTS, 100], ids=["whole", "rows"])
def test_logprobs_and_gradient_equal_the_unshared_forward(preset, chunk_elements):
    model = _model(preset)
    batch = grouped_batch(model.config.vocab_size, order=[0, 3, 1, 6, 2, 9, 4, 5, 7, 8, 10, 11])
    assert len(prompt_groups(batch).first) == 4  # what gets encoded under sharing
    logp0, ent0, g0 = _scores(model, batch, "off", chunk_elements=chunk_elements)
    logp1, ent1, g1 = _scores(model, batch, "on", chunk_elements=chunk_elements)
    m = batch.response_mask
    assert (logp1 - logp0)[m].abs().max() <= 1e-5
    assert (ent1 - ent0)[m].abs().max() <= 1e-5
    _close_rel(g1, g0, 1e-5)


def _sliding(kind: str, window: int):
    """A Mistral whose layers all slide (the ``arith_tools`` preset's shape), or a Qwen2 with one
    sliding and one full layer: the two caches transformers builds from a config with windows."""
    torch.manual_seed(0)
    if kind == "mistral":
        config = tiny_config("arith_tools")
        config.sliding_window = window
        return MistralForCausalLM(config).float()
    shape = tiny_config("tiny").to_dict()
    shape = {k: shape[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                   "num_attention_heads", "num_key_value_heads")}  # fmt: skip
    config = Qwen2Config(
        **shape, num_hidden_layers=2, use_sliding_window=True, sliding_window=window,
        max_window_layers=1, layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


@pytest.mark.parametrize("kind", ["mistral", "qwen2_mixed"])
@pytest.mark.parametrize("window", [3, 6, 30])
def test_sliding_window_layers_share_exactly(kind, window):
    """transformers' sliding cache keeps a prompt's last ``window - 1`` columns and masks the
    responses by column; a batch row has no holes (left-padded prompt, then its response), so
    columns are tokens and the shared forward equals the full one: windows shorter than the
    shortest prompt, between, and longer than any row."""
    model = _sliding(kind, window)
    layers = {type(x).__name__ for x in DynamicCache(config=model.config).layers}
    assert "DynamicSlidingWindowLayer" in layers
    batch = grouped_batch(model.config.vocab_size, order=[0, 3, 1, 6, 2, 9, 4, 5, 7, 8, 10, 11])
    logp0, ent0, g0 = _scores(model, batch, "off")
    logp1, ent1, g1 = _scores(model, batch, "on")
    m = batch.response_mask
    assert (logp1 - logp0)[m].abs().max() <= 1e-5
    assert (ent1 - ent0)[m].abs().max() <= 1e-5
    _close_rel(g1, g0, 1e-5)


@pytest.mark.parametrize("r", [1, 2])
def test_one_and_two_token_responses(r):
    model = _model()
    batch = grouped_batch(model.config.vocab_size, groups=3, n=3, r=r, seed=8)
    logp0, _, g0 = _scores(model, batch, "off")
    logp1, _, g1 = _scores(model, batch, "on")
    assert (logp1 - logp0)[batch.response_mask].abs().max() <= 1e-5
    _close_rel(g1, g0, 1e-5)


def test_shared_forward_runs_each_prompt_once():
    model = _model()
    batch = grouped_batch(model.config.vocab_size, groups=3, n=4)
    widths = []
    model.model.embed_tokens.register_forward_hook(lambda m, i, o: widths.append(i[0].shape))
    with use_shared_prefix("on"):
        lp.response_logprobs(model, batch)
    trimmed = trim_padding(batch)  # columns that are padding in every row never run
    p, r = trimmed.prompt_width, trimmed.response_width
    assert widths == [torch.Size([3, p]), torch.Size([12, r - 1])]


def test_lora_policy_and_adapter_free_reference_equal_the_unshared_forward():
    model = apply_lora(_model(), 4, 8.0, ["q_proj", "k_proj", "v_proj", "o_proj"], seed=0)
    with torch.no_grad():  # B starts at 0: give the adapters a value so they change outputs
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    batch = grouped_batch(model.config.vocab_size, seed=3)
    logp0, _, g0 = _scores(model, batch, "off")
    logp1, _, g1 = _scores(model, batch, "on")
    m = batch.response_mask
    assert (logp1 - logp0)[m].abs().max() <= 1e-5
    _close_rel(g1, g0, 1e-5)
    ref = AdapterFreeReference(model)
    with torch.no_grad():
        outs = []
        for mode in ("off", "on"):
            with use_shared_prefix(mode):
                outs.append(lp.response_logprobs(ref, batch))
    assert (outs[1] - outs[0])[m].abs().max() <= 1e-5
    assert (outs[1] - logp1)[m].abs().max() > 1e-3  # the reference really is the base


def test_opd_teacher_annotations_equal_the_unshared_forward(tmp_path):
    from posttrain.placement.teacher import TeacherRole

    student = build_tiny_model("arith", tmp_path / "student", seed=0)
    teacher = build_tiny_model("arith", tmp_path / "teacher", seed=1)
    out = {}
    for mode in ("off", "on"):
        opts = [f"model.name_or_path={student}", "model.init_preset=null", "job.algorithm=opd",
                f"teacher.name_or_path={teacher}", "rl.distillation_mode=direct",
                "teacher.top_k=4", "rl.micro_batch_size=5", f"rl.shared_prefix={mode}"]  # fmt: skip
        role = TeacherRole(load_config("arithmetic", ["--", *opts]))
        out[mode] = role.annotations(grouped_batch(22, groups=3, n=4, seed=4))
    for name in ("teacher_logprobs", "teacher_topk_logprobs"):
        assert (out["on"][name] - out["off"][name]).abs().max() <= 1e-5
    assert torch.equal(out["on"]["teacher_topk_ids"], out["off"]["teacher_topk_ids"])


def _grpo_run(preset, mode, micro, groups):
    model = _model(preset, seed=1)
    reference = copy.deepcopy(model)
    rl = RLConfig(kl_beta=0.05, micro_batch_size=micro, lr=1e-3)
    ctx = SimpleNamespace(max_response_length=6, reference_model=reference)
    trainer = LLMTrainer(
        model, make_objective(rl, ctx), lr=rl.lr, micro_batch_size=micro,
        shared_prefix=mode, auxiliary_models=(reference,),
    )  # fmt: skip
    # Three optimizer steps: two from one collected batch (π_old captured by its own forward),
    # then one that follows the policy.
    for seed, minis in ((10, 2), (11, 1)):
        batch = grouped_batch(model.config.vocab_size, groups=groups, n=4, seed=seed)
        trainer.train_on_batch(batch, mini_batches=minis)
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("preset,groups", [("tiny", 4), ("small", 2)])
def test_three_grpo_steps_with_and_without_sharing_give_the_same_parameters(preset, groups):
    # micro-batches of 3 rows split the groups of 4
    off = _grpo_run(preset, "off", 3, groups)
    on = _grpo_run(preset, "on", 3, groups)
    start = [p.detach() for p in _model(preset, seed=1).parameters()]
    assert any((a - b).abs().max() > 1e-4 for a, b in zip(off, start, strict=True))
    # Over all parameters: Adam's first steps move each weight by ~lr whatever the size of its
    # gradient, so on a weight with a near-zero gradient float32 rounding alone shows up (in
    # float64 the shared logprobs are bit-identical to the unshared ones).
    diff = torch.cat([(a - b).flatten() for a, b in zip(on, off, strict=True)]).norm()
    assert diff <= 1e-5 * torch.cat([b.flatten() for b in off]).norm()


def test_group_chunks_keep_groups_whole_where_they_fit():
    assert group_chunks([0, 0, 0, 1, 1, 1, 2, 2, 2], 6) == [slice(0, 6), slice(6, 9)]
    assert group_chunks([0, 0, 0, 1, 1, 1, 2, 2, 2], 4) == [slice(0, 3), slice(3, 6), slice(6, 9)]
    # a group longer than a micro-batch gets chunks of its own; neighbours are not cut
    assert group_chunks([0, 1, 1, 1, 1, 1, 2], 2) == [
        slice(0, 1), slice(1, 3), slice(3, 5), slice(5, 6), slice(6, 7),
    ]  # fmt: skip
    assert group_chunks([], 3) == []


def test_token_sum_update_is_exact_however_rows_are_grouped():
    torch.manual_seed(0)
    model = _model().double()
    batch = grouped_batch(model.config.vocab_size, groups=3, n=4, seed=5).map(
        lambda t: t.double() if t.is_floating_point() else t
    )
    rl = RLConfig(grpo_surrogate="legacy_pg")
    objective = make_objective(rl, SimpleNamespace(max_response_length=6, reference_model=None))
    grads = []
    for cut in (row_chunks(12, 12), row_chunks(12, 5), group_chunks(batch.group_ids.tolist(), 5)):
        model.zero_grad()
        with use_shared_prefix("on"):
            accumulate_gradients(model, objective, [batch[s] for s in cut])
        grads.append([p.grad.clone() for p in model.parameters()])
    for other in grads[1:]:
        _close_rel(other, grads[0], 1e-6)  # HF norms run in float32


def test_trainer_micro_batches_hold_whole_groups_when_sharing():
    model = _model()
    rl = RLConfig(grpo_surrogate="legacy_pg")
    objective = make_objective(rl, SimpleNamespace(max_response_length=6, reference_model=None))
    batch = grouped_batch(model.config.vocab_size, groups=4, n=3)
    for mode, want in (("auto", [6, 6]), ("off", [7, 5])):
        t = LLMTrainer(model, objective, lr=1e-3, micro_batch_size=7, shared_prefix=mode)
        sizes = [s.stop - s.start for s in t.micro_slices(batch)]
        assert sizes == want


def test_on_refuses_an_unsupported_model_in_one_line_and_auto_says_so_once(caplog):
    model = _model()
    model.config._attn_implementation = "flash_attention_2"
    batch = grouped_batch(model.config.vocab_size, groups=2, n=3)
    with pytest.raises(SharedPrefixUnsupported) as e, use_shared_prefix("on"):
        lp.response_logprobs(model, batch)
    assert "rl.shared_prefix=on but attention implementation 'flash_attention_2'" in str(e.value)
    assert "\n" not in str(e.value)
    model.config._attn_implementation = "sdpa"
    rl = RLConfig(grpo_surrogate="legacy_pg")
    objective = make_objective(rl, SimpleNamespace(max_response_length=6, reference_model=None))
    with pytest.raises(SharedPrefixUnsupported, match="activation checkpointing"):
        LLMTrainer(model, objective, lr=1e-3, micro_batch_size=4, gradient_checkpointing=True,
                   shared_prefix="on")  # fmt: skip
    prefix._SAID.clear()
    with caplog.at_level(logging.WARNING, logger="posttrain.data.prefix"):
        for _ in range(2):
            lp.response_logprobs(model, batch)  # auto, training with checkpointing: falls back
    said = [r for r in caplog.records if "shared-prefix forward off" in r.getMessage()]
    assert len(said) == 1 and "activation checkpointing" in said[0].getMessage()


def test_rollout_prefills_each_prompt_once_and_its_logprobs_match_the_shared_scoring():
    from posttrain.rollout import TorchRolloutEngine
    from posttrain.rollout.graph_engine import GraphRolloutEngine

    model = _model()
    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [10, 11]]  # the last one repeats
    for engine in (TorchRolloutEngine, GraphRolloutEngine):
        widths = []
        hook = model.model.embed_tokens.register_forward_hook(
            lambda m, i, o, widths=widths: widths.append(tuple(i[0].shape))
        )
        out = engine(model, stop_token_ids=[2]).generate(prompts, n=4, max_tokens=6, seed=0)
        hook.remove()
        assert widths[0] == (3, 5)  # one prefill row per distinct prompt, not per sample
        assert out.batch.batch_size == 16 and out.batch.group_ids.tolist()[12:] == [3] * 4
        batch = out.batch
        with torch.no_grad(), use_shared_prefix("on"):
            scored = lp.response_logprobs(model, batch)
        m = batch.response_mask
        assert (scored - batch.rollout_logprobs)[m].abs().max() <= 1e-5


def test_shuffled_rows_are_regrouped_within_the_step():
    model = _model()
    rl = RLConfig(grpo_surrogate="legacy_pg")
    objective = make_objective(rl, SimpleNamespace(max_response_length=6, reference_model=None))
    batch = grouped_batch(model.config.vocab_size, groups=3, n=2, order=[0, 2, 4, 1, 3, 5])
    t = LLMTrainer(model, objective, lr=1e-3, micro_batch_size=4, shared_prefix="auto")
    assert t.micro_slices(batch) == [[0, 3, 1, 4], [2, 5]]
    assert group_order([5, 7, 5, 9, 7]) == [0, 2, 1, 4, 3]


def test_two_ranks_with_sharing_take_the_single_rank_gradient():
    """Dispatch (groups kept together) + per-rank micro-batches + TOKEN_SUM normalisation, the
    all-reduce simulated: the ranks' weighted gradients sum to the single-rank gradient."""
    model = _model().double()
    batch = grouped_batch(model.config.vocab_size, groups=5, n=3, seed=7, order=None)
    batch = batch[torch.randperm(len(batch), generator=torch.Generator().manual_seed(0))]
    objective = make_objective(
        RLConfig(grpo_surrogate="legacy_pg"),
        SimpleNamespace(max_response_length=6, reference_model=None),
    )
    trainer = LLMTrainer(model, objective, lr=1e-3, micro_batch_size=4, shared_prefix="on")

    def grad(rows: TrajectoryBatch) -> tuple[list[torch.Tensor], float]:
        model.zero_grad()
        with trainer.forward_context():
            acc = accumulate_gradients(
                model, objective, [rows[s] for s in trainer.micro_slices(rows)]
            )
        return [p.grad.clone() for p in model.parameters()], acc.weight

    first_mini = batch[split_evenly(len(batch), 2)[0]]
    whole, _ = grad(first_mini)
    parts = []
    for shard in shard_batch(batch, 2, 2, keep_groups=True):
        g, w = grad(shard[split_evenly(len(shard), 2)[0]])
        parts.append((g, w))
    weight = sum(w for _, w in parts)
    reduced = [sum(g[i] * w for g, w in parts) / weight for i in range(len(whole))]
    _close_rel(reduced, whole, 1e-6)  # HF norms run in float32
