"""Dynamic sampling: informative groups, rounds, shortfall, the data cursor, and re-padding."""

from __future__ import annotations

import torch
from conftest import tiny_llama

from posttrain.data.logprobs import response_logprobs
from posttrain.data.tasks import TaskItem
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.reward.dynamic_sampling import informative, sample_step
from posttrain.reward.scores import RowScores
from posttrain.rollout.base import Rollout
from posttrain.rollout.concat import concat_rollouts, keep_groups

N = 2


def _take(cursor: int, count: int):
    items = [TaskItem(f"q{c}", str(c), {"id": str(c)}) for c in range(cursor, cursor + count)]
    return items, cursor + count


def _generate(items, rnd: int) -> Rollout:
    """Round ``rnd`` has prompt width 2 + rnd and response width 3 + rnd (re-padding needed)."""
    g = torch.Generator().manual_seed(100 + rnd)
    b, p, r = len(items) * N, 2 + rnd, 3 + rnd
    ids = torch.randint(3, 16, (b, p + r), generator=g)
    lengths = torch.randint(1, r + 1, (b,), generator=g)
    mask = torch.arange(r).unsqueeze(0) < lengths.unsqueeze(1)
    attn = torch.cat([torch.ones(b, p, dtype=torch.long), mask.long()], 1)
    attn[0, 0] = 0  # one left-padded prompt
    batch = TrajectoryBatch(
        input_ids=ids, attention_mask=attn, response_mask=mask,
        group_ids=torch.tensor([int(it.answer) for it in items]).repeat_interleave(N),
        sample_ids=torch.arange(b, dtype=torch.int64) + 1000 * rnd,
        rollout_logprobs=torch.where(mask, -0.5, 0.0),
    )  # fmt: skip
    texts = tuple(f"{it.answer}/{j}" for it in items for j in range(N))
    return Rollout(batch, lengths == r, texts, N)


def _score(rollout: Rollout, items) -> RowScores:
    """Item c is flat (both responses 0.5) when c % 3 == 0, else rewards (1, 0)."""
    r = [0.5 if int(it.answer) % 3 == 0 else x for it in items for x in (1.0, 0.0)]
    t = torch.tensor(r, dtype=torch.float64)
    return RowScores(t, t, t >= 1, t > 0, {})


def _run(cursor=0, prompts=4, dynamic=True, max_rounds=3, score=_score):
    return sample_step(
        cursor, prompts=prompts, take=_take, generate=_generate, score=score,
        dynamic=dynamic, max_rounds=max_rounds,
    )  # fmt: skip


def test_informative_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.3, 0.3], dtype=torch.float64)
    assert informative(r, 2).tolist() == [False, True, False]


def test_rounds_until_enough_informative_groups():
    # Round 0 draws items 0-3 (0, 3 flat): keeps 1, 2. Round 1 draws 4-7 (6 flat): keeps 4, 5
    # and drops 7, which would exceed the 4 groups the step needs.
    out = _run()
    assert [it.answer for it in out.items] == ["1", "2", "4", "5"]
    assert out.cursor == 8
    assert out.metrics == {
        "sampling/rounds": 2.0, "sampling/shortfall_groups": 0.0, "sampling/kept_groups": 4.0,
    }  # fmt: skip
    assert out.rollout.texts == ("1/0", "1/1", "2/0", "2/1", "4/0", "4/1", "5/0", "5/1")
    assert out.rollout.batch.group_ids.tolist() == [1, 1, 2, 2, 4, 4, 5, 5]
    assert out.scores.rewards.tolist() == [1.0, 0.0] * 4
    # Both rounds' responses count as generated, the dropped groups included.
    want = sum(
        int(_generate(_take(c, 4)[0], r).response_lengths.sum()) for c, r in ((0, 0), (4, 1))
    )
    assert out.generated_tokens == want


def test_shortfall_after_the_last_round_and_resume_from_the_cursor():
    out = _run(max_rounds=1)
    assert out.metrics["sampling/shortfall_groups"] == 2.0 and out.cursor == 4
    # A resumed run continues from the saved cursor and samples what the straight run would.
    again = _run(cursor=out.cursor, max_rounds=1)
    assert [it.answer for it in again.items] == ["4", "5", "7"] and again.cursor == 8


def test_no_informative_group_trains_on_the_last_round():
    flat = lambda ro, items: _score(ro, [TaskItem("q", "3", {}) for _ in items])  # noqa: E731
    out = _run(score=flat, max_rounds=2)
    assert out.metrics["sampling/shortfall_groups"] == 4.0 and out.metrics["sampling/rounds"] == 2
    assert [it.answer for it in out.items] == ["4", "5", "6", "7"] and out.cursor == 8


def test_off_is_one_plain_round():
    out = _run(dynamic=False)
    assert [it.answer for it in out.items] == ["0", "1", "2", "3"]
    assert out.cursor == 4 and out.metrics == {} and out.rollout.batch.batch_size == 8


def test_concat_repads_without_changing_logprobs():
    model = tiny_llama()
    a = _generate(_take(0, 2)[0], 0)
    b = _generate(_take(2, 3)[0], 2)
    b = keep_groups(b, torch.tensor([True, False, True]))
    joined = concat_rollouts([a, b])
    assert joined.batch.prompt_width == 4 and joined.batch.response_width == 5
    assert joined.truncated.tolist() == a.truncated.tolist() + b.truncated.tolist()
    whole = response_logprobs(model, joined.batch)
    for part, rows in ((a, slice(0, 4)), (b, slice(4, 8))):
        want = response_logprobs(model, part.batch)
        r = part.batch.response_width
        got = whole[rows, :r]
        m = part.batch.response_mask
        torch.testing.assert_close(got[m], want[m], rtol=1e-10, atol=1e-10)
        assert not joined.batch.response_mask[rows, r:].any()
        torch.testing.assert_close(
            joined.batch.rollout_logprobs[rows, :r], part.batch.rollout_logprobs
        )


def test_concat_repads_top_k_annotations():
    def with_topk(ro: Rollout) -> Rollout:
        b, r = ro.batch.batch_size, ro.batch.response_width
        ids = torch.arange(b * r * 2).reshape(b, r, 2) % 16
        batch = ro.batch.replace(teacher_topk_ids=ids, teacher_topk_logprobs=-ids.double())
        return Rollout(batch, ro.truncated, ro.texts, ro.n)

    a = with_topk(_generate(_take(0, 1)[0], 0))
    b = with_topk(_generate(_take(1, 1)[0], 1))
    joined = concat_rollouts([a, b]).batch
    assert joined.teacher_topk_ids.shape == (4, 4, 2)
    assert torch.equal(joined.teacher_topk_ids[:2, :3], a.batch.teacher_topk_ids)
    assert torch.equal(joined.teacher_topk_ids[2:], b.batch.teacher_topk_ids)
    assert not joined.teacher_topk_ids[:2, 3:].any()
