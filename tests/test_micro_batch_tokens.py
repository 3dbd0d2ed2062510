"""rl.micro_batch_tokens: token-budget micro-batches, trimmed padding, the padding metric."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from test_shared_prefix import grouped_batch
from transformers import LlamaForCausalLM

from posttrain.algorithm.grpo import make_objective
from posttrain.algorithm.primitives.objective import MetricAdapter, Objective, Reduction
from posttrain.config.rl import RLConfig
from posttrain.data import logprobs as lp
from posttrain.data.padding import padding_counts, row_lengths, trim_padding
from posttrain.data.prefix import use_shared_prefix
from posttrain.entrypoints.cli import main
from posttrain.model.tiny import tiny_config
from posttrain.trainer import LLMTrainer
from posttrain.trainer.accumulate import token_chunks


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model(seed: int = 1) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config("tiny")).double()


def _double(batch):
    return batch.map(lambda t: t.double() if t.is_floating_point() else t)


def test_token_chunks_sort_by_length_and_pack_to_the_budget():
    # rows' (prompt, response): lengths 2+1, 2+6, 2+3, 2+6, 2+2 -> sorted 1,3 | 2 | 4,0
    prompt, response = [2, 2, 2, 2, 2], [1, 6, 3, 6, 2]
    assert token_chunks(prompt, response, 16) == [[1, 3], [2, 4, 0]]  # 2x8=16, 3x5=15
    assert token_chunks(prompt, response, 15) == [[1], [3], [2, 4, 0]]
    # a row over the budget runs alone; the rest still pack
    assert token_chunks(prompt, response, 4) == [[1], [3], [2], [4], [0]]
    assert token_chunks([], [], 8) == []
    # an empty response still forwards one column
    assert token_chunks([3, 3], [0, 0], 8) == [[0, 1]]


def test_token_chunks_keep_groups_whole_and_split_only_a_group_over_the_budget():
    prompt = [4] * 7
    response = [1, 2, 6, 6, 1, 1, 2]
    groups = [0, 0, 1, 1, 2, 2, 2]
    # group 1 (longest, 2 x 10 = 20) fits alone; groups 0 and 2 (5 rows x 6) pack together
    assert token_chunks(prompt, response, 30, groups) == [[2, 3], [1, 0, 6, 4, 5]]
    # group 1 over a budget of 12 is split into row chunks; its neighbours are not cut
    assert token_chunks(prompt, response, 12, groups) == [[2], [3], [1, 0], [6, 4], [5]]
    with pytest.raises(ValueError, match="micro_batch_tokens must be >= 1"):
        token_chunks(prompt, response, 0, groups)


def test_trim_padding_drops_only_columns_that_are_padding_in_every_row():
    batch = grouped_batch(100, groups=3, n=2, p=9, r=6, seed=3)
    rows = batch[[0, 1]]  # the first group: a 1-token prompt
    prompt, response = row_lengths(rows)
    trimmed = trim_padding(rows)
    assert trimmed.prompt_width == max(prompt) == 1
    assert trimmed.response_width == max(1, max(response))
    assert torch.equal(trimmed.attention_mask.sum(1), rows.attention_mask.sum(1))
    assert trim_padding(batch) is batch or trim_padding(batch).input_ids.shape[1] <= 15


def test_trimmed_logprobs_equal_each_row_scored_alone():
    model = _model()
    batch = _double(grouped_batch(model.config.vocab_size, groups=3, n=3, seed=4))
    with use_shared_prefix("off"):
        together = lp.response_logprobs(model, batch)
        alone = torch.cat([lp.response_logprobs(model, batch[[i]]) for i in range(len(batch))])
    mask = batch.response_mask
    assert torch.allclose(together[mask], alone[mask], atol=1e-5, rtol=0)
    # each row alone is trimmed to its own response; the scores past it are padding (zeros)
    _, response = row_lengths(batch)
    assert alone.shape == mask.shape
    assert all(not alone[i, max(1, n) :].any() for i, n in enumerate(response))
    assert any(n < batch.response_width for n in response)


def _grpo_params(tokens: int | None, mode: str) -> list[torch.Tensor]:
    model = _model()
    reference = copy.deepcopy(model)
    rl = RLConfig(kl_beta=0.05, lr=1e-3)
    ctx = SimpleNamespace(max_response_length=6, reference_model=reference)
    trainer = LLMTrainer(
        model, make_objective(rl, ctx), lr=rl.lr, micro_batch_size=5, shared_prefix=mode,
        micro_batch_tokens=tokens, auxiliary_models=(reference,),
    )  # fmt: skip
    for seed, minis in ((10, 2), (11, 1)):  # a frozen π_old, then one following the policy
        trainer.train_on_batch(_double(grouped_batch(100, groups=4, n=4, seed=seed)), minis)
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("mode", ["off", "on"])
def test_token_micro_batches_give_the_row_micro_batch_update(mode):
    rows = _grpo_params(None, mode)
    start = [p.detach() for p in _model().parameters()]
    assert any((a - b).abs().max() > 1e-4 for a, b in zip(rows, start, strict=True))
    for budget in (20, 45):
        tokens = _grpo_params(budget, mode)
        diff = torch.cat([(a - b).flatten() for a, b in zip(tokens, rows, strict=True)]).norm()
        # float64 model; HF's RMSNorm computes in float32, so rounding shows at ~1e-8
        assert diff <= 1e-6 * torch.cat([b.flatten() for b in rows]).norm()


def _trainer(tokens: int | None, mode: str = "auto", **kw) -> LLMTrainer:
    rl = RLConfig(grpo_surrogate="legacy_pg")
    objective = make_objective(rl, SimpleNamespace(max_response_length=6, reference_model=None))
    return LLMTrainer(
        _model(), objective, lr=1e-3, micro_batch_size=4, shared_prefix=mode,
        micro_batch_tokens=tokens, **kw,
    )  # fmt: skip


def test_sharing_keeps_groups_whole_under_a_token_budget():
    batch = grouped_batch(100, groups=4, n=3, seed=2)
    ids = batch.group_ids.tolist()
    chunks = _trainer(60).micro_slices(batch)
    assert len(chunks) > 1
    for chunk in chunks:
        inside = [ids[i] for i in chunk]
        assert all(ids.count(g) == inside.count(g) for g in set(inside))
    off = _trainer(60, "off").micro_slices(batch)
    assert sorted(i for c in off for i in c) == list(range(len(batch)))


def test_padding_fraction_is_reported_and_smaller_with_token_micro_batches():
    # one-token prompts, responses of 0..12 tokens: padding is the responses' spread
    batch = grouped_batch(100, groups=4, n=4, p=1, r=12, seed=7)
    rows = _trainer(None, "off")  # 4 rows a micro-batch
    tokens = _trainer(4 * 13, "off")  # the same budget as 4 of the longest rows
    real, forwarded = padding_counts(batch, rows.micro_slices(batch))
    assert real == int(batch.attention_mask.sum())
    by_rows = rows.batch_metrics(batch)["train/padding_fraction"]
    assert by_rows == pytest.approx(1 - real / forwarded) and by_rows > 0.2
    assert len(tokens.micro_slices(batch)) <= len(rows.micro_slices(batch))
    assert 0 <= tokens.batch_metrics(batch)["train/padding_fraction"] < by_rows / 2
    # hand value: one row of 3 real tokens next to one of 1 in a [2 x 3] trimmed forward
    two = grouped_batch(100, groups=1, n=2, p=2, r=2, seed=0)
    (p0, p1), (r0, r1) = row_lengths(two)
    width = max(p0, p1) + max(1, r0, r1)
    assert padding_counts(two, [slice(0, 2)]) == (p0 + p1 + r0 + r1, 2 * width)


def test_trainer_refuses_token_micro_batches_where_they_are_not_exact():
    mean = Objective(lambda m, b: (torch.zeros(()), {}), Reduction.MEAN, MetricAdapter())
    with pytest.raises(ValueError, match="TOKEN_SUM objective"):
        LLMTrainer(_model(), mean, lr=1e-3, micro_batch_size=4, micro_batch_tokens=64)
    with pytest.raises(ValueError, match="certified_deterministic_forward"):
        _trainer(64, certified_deterministic_forward=True)


@pytest.mark.parametrize(
    ("opts", "fragment"),
    [
        (["rl.micro_batch_tokens=0"], "rl.micro_batch_tokens: Input should be greater than"),
        (["rl.micro_batch_tokens=lots"], "rl.micro_batch_tokens: Input should be a valid integer"),
    ],
)
def test_bad_budget_is_a_one_line_error(capsys, opts, fragment):
    assert main(["config", "show", "--config", "arithmetic", "--", *opts]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and fragment in err and "Traceback" not in err


def test_a_budget_below_one_response_warns_in_preflight(capsys):
    argv = ["config", "show", "--config", "arithmetic", "--", "rl.micro_batch_tokens=8",
            "rollout.max_tokens=16"]  # fmt: skip
    assert main(argv) == 0
    out, err = capsys.readouterr()
    warned = [x for x in (out + err).splitlines() if "micro_batch_tokens=8 is" in x]
    assert warned == [
        "warning: rl.micro_batch_tokens=8 is below one row: a row forwards its prompt plus up to "
        "rollout.max_tokens=16 response tokens, so each such row runs alone, one forward per "
        "row; set rl.micro_batch_tokens to at least the longest prompt + 16"
    ]


def test_a_budget_below_the_first_batch_s_rows_warns_once_naming_the_smallest(tmp_path, caplog):
    """Rows over the budget run alone (many times slower), silently before: one line at the
    first step names the smallest budget that fits every row of that batch."""
    import logging

    from posttrain.model.tiny import build_tiny_model

    model = build_tiny_model("tiny", tmp_path / "m")
    opts = {
        "job.output_root": tmp_path / "out", "model.name_or_path": model, "data.train_size": 40,
        "data.val_size": 4, "data.prompts_per_step": 2, "rollout.n": 2, "rollout.max_tokens": 2,
        "rl.max_steps": 2, "rl.eval_every": 0, "rl.micro_batch_tokens": 3,
        "logging.progress": False,
    }  # fmt: skip
    caplog.set_level(logging.WARNING, logger="posttrain")
    assert (
        main(["grpo", "--config", "arithmetic", "--", *(f"{k}={v}" for k, v in opts.items())]) == 0
    )
    warned = [m for m in caplog.messages if "micro_batch_tokens" in m]
    assert len(warned) == 1, warned
    assert warned[0].startswith(
        "rl.micro_batch_tokens=3 is below one row: 4 of the first batch's 4 rows"
    )
    smallest = int(warned[0].split("to at least ")[1].split()[0])
    assert smallest > 3 and f"up to {smallest} tokens, prompt + response" in warned[0]
