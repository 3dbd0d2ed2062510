"""The reward stage: hand-computed rewards, advantages, masks, metrics and named errors."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch

from posttrain.algorithm.annotators.advantage import shared_prefix_mask
from posttrain.data.tasks import TaskItem
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.reward import RewardError, RewardStage
from posttrain.reward.functions import functions_weight
from posttrain.reward.scores import RowScores

USER_MODULE = textwrap.dedent(
    """
    import math

    def minus_len(prompt, completion, answer, meta):
        return -0.1 * len(completion)

    def boom(prompt, completion, answer, meta):
        if "6" in completion:
            raise ZeroDivisionError("no sixes")
        return 0.0

    def nan_on_six(prompt, completion, answer, meta):
        return math.nan if "6" in completion else 0.0

    def inf_on_six(prompt, completion, answer, meta):
        return -math.inf if "6" in completion else 0.0

    def text(prompt, completion, answer, meta):
        return "1.0"

    def nothing(prompt, completion, answer, meta):
        return None
    """
)

G0 = TaskItem("1+1=", "2", {"id": "g0"})
G1 = TaskItem("2*3=", "6", {"id": "g1"})
ITEMS = [G0, G0, G1, G1]
COMPLETIONS = ["2", "\\boxed{3}", "\\boxed{6}", "\\boxed{6}"]


@pytest.fixture(autouse=True)
def user_module(tmp_path, monkeypatch):
    (tmp_path / "stage_rewards.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))


def _batch(resp_ids=None, resp_len=(3, 2, 3, 3)) -> TrajectoryBatch:
    """B=4 rows in 2 groups, P=2, R=3; sample ids 10..13."""
    p, r = 2, 3
    if resp_ids is None:
        resp_ids = [[5, 6, 7], [5, 8, 0], [4, 4, 9], [4, 4, 3]]
    resp = torch.tensor(resp_ids)
    mask = torch.arange(r).unsqueeze(0) < torch.tensor(resp_len).unsqueeze(1)
    prompt = torch.full((4, p), 3)
    return TrajectoryBatch(
        input_ids=torch.cat([prompt, resp], 1),
        attention_mask=torch.cat([torch.ones(4, p, dtype=torch.long), mask.long()], 1),
        response_mask=mask,
        group_ids=torch.tensor([7, 7, 2, 2]),
        sample_ids=torch.tensor([10, 11, 12, 13]),
    )


def _stage(**kw) -> RewardStage:
    args = dict(
        verifier="exact",
        format_weight=0.5,
        functions=["stage_rewards:minus_len"],
        group_size=2,
        estimator="grpo",
        advantage_eps=1e-6,
        shared_prefix_mask=False,
        dtype=torch.float64,
    )
    args.update(kw)
    return RewardStage(**args)


def test_rewards_advantages_and_metrics_by_hand():
    out = _stage()(_batch(), COMPLETIONS, ITEMS, truncated=torch.tensor([0, 0, 1, 0]))
    # verifier + 0.5 * boxed-format - 0.1 * len(completion)
    want = torch.tensor([1 - 0.1, 0 + 0.5 - 0.9, 1 + 0.5 - 0.9, 1 + 0.5 - 0.9], dtype=torch.float64)
    torch.testing.assert_close(out.batch.rewards, want)
    # group 7: mean 0.25, deviations +-0.65, Bessel std 0.65*sqrt(2) -> +-1/sqrt(2); group 2: 0
    s = 1 / math.sqrt(2)
    torch.testing.assert_close(
        out.batch.advantages,
        torch.tensor([s, -s, 0.0, 0.0], dtype=torch.float64),
        atol=1e-5,
        rtol=0,
    )
    m = out.metrics
    assert m["reward/mean"] == pytest.approx(0.425)
    assert m["reward/std"] == pytest.approx(math.sqrt(0.9675 / 4))
    assert m["reward/accuracy"] == 0.75
    assert m["reward/verifier_mean"] == 0.75
    assert m["reward/format_frac"] == 0.75
    assert m["reward/zero_variance_group_frac"] == 0.5
    assert m["reward/response_length_mean"] == pytest.approx(11 / 4)
    assert m["reward/truncated_frac"] == 0.25
    assert m["reward/fn/stage_rewards:minus_len_mean"] == pytest.approx(-0.1 * 28 / 4)
    assert "reward/shared_prefix_masked_frac" not in m
    assert out.scores.correct.tolist() == [True, False, True, True]
    assert torch.equal(out.batch.response_mask, _batch().response_mask)  # untouched


@pytest.mark.parametrize(
    ("anneal", "step", "want"),
    [(0, 1, 1.0), (0, 10**6, 1.0), (4, 0, 1.0), (4, 1, 1.0), (4, 2, 0.75), (4, 4, 0.25),
     (4, 5, 0.0), (4, 99, 0.0), (1, 1, 1.0), (1, 2, 0.0)],
)  # fmt: skip
def test_functions_weight_falls_linearly_to_zero_after_the_anneal(anneal, step, want):
    assert functions_weight(anneal, step) == want


def test_annealed_functions_count_with_their_weight_and_report_their_own_values():
    weighted = _stage().rollout_scores(_batch(), COMPLETIONS, ITEMS, functions_weight=0.25)
    full = _stage().rollout_scores(_batch(), COMPLETIONS, ITEMS)
    fn = -0.1 * torch.tensor([1, 9, 9, 9], dtype=torch.float64)  # minus_len of each completion
    torch.testing.assert_close(weighted.rewards, full.rewards - 0.75 * fn)
    assert torch.equal(weighted.functions["stage_rewards:minus_len"], fn)  # unweighted
    out = _stage()(_batch(), COMPLETIONS, ITEMS, scores=weighted)
    torch.testing.assert_close(out.batch.rewards, weighted.rewards)
    assert out.metrics["reward/functions_weight"] == 0.25
    assert out.metrics["reward/fn/stage_rewards:minus_len_mean"] == pytest.approx(-0.7)
    plain = _stage(functions=[])(_batch(), COMPLETIONS, ITEMS)
    assert "reward/functions_weight" not in plain.metrics  # no functions, no weight to report
    with pytest.raises(ValueError, match=r"functions weights \[0.25, 1.0\]"):
        RowScores.concat([weighted, full])


def test_dr_grpo_estimator_and_float32_default():
    out = _stage(estimator="dr_grpo", dtype=torch.float32)(_batch(), COMPLETIONS, ITEMS)
    assert out.batch.advantages.dtype == torch.float32 == out.batch.rewards.dtype
    torch.testing.assert_close(out.batch.advantages, torch.tensor([0.65, -0.65, 0.0, 0.0]))


def test_shared_prefix_mask_narrows_the_response_mask():
    batch = _batch()
    out = _stage(shared_prefix_mask=True)(batch, COMPLETIONS, ITEMS)
    # group 7 shares token 5 at position 0; group 2 shares [4, 4] at positions 0-1.
    want = torch.tensor(
        [[False, True, True], [False, True, False], [False, False, True], [False, False, True]]
    )
    assert torch.equal(out.batch.response_mask, want)
    assert torch.equal(
        want, shared_prefix_mask(batch.response_ids, batch.response_mask, batch.group_ids)
    )
    assert out.metrics["reward/shared_prefix_masked_frac"] == pytest.approx(6 / 11)
    assert out.metrics["reward/response_length_mean"] == pytest.approx(11 / 4)  # before masking


def test_math_verifier_and_no_functions():
    pytest.importorskip("math_verify")
    items = [TaskItem("half?", "0.5", {"id": "h"})] * 2 + [G1, G1]
    comps = ["\\boxed{\\frac{1}{2}}", "\\boxed{2}", "#### 6", "6.0"]
    out = _stage(verifier="math", functions=[], format_weight=0.0)(_batch(), comps, items)
    assert out.scores.correct.tolist() == [True, False, True, True]
    assert out.batch.rewards.tolist() == [1.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize(
    ("fn", "needle"),
    [
        ("boom", "reward function 'stage_rewards:boom' raised ZeroDivisionError: no sixes"),
        ("nan_on_six", "reward function 'stage_rewards:nan_on_six' returned nan"),
        ("inf_on_six", "reward function 'stage_rewards:inf_on_six' returned -inf"),
    ],
)
def test_failing_or_non_finite_reward_names_sample_and_function(fn, needle):
    with pytest.raises(RewardError) as e:
        _stage(functions=[f"stage_rewards:{fn}"])(_batch(), COMPLETIONS, ITEMS)
    msg = str(e.value)
    assert needle in msg
    assert "row 2 (sample_id 12, item g1, prompt '2*3=')" in msg


@pytest.mark.parametrize("fn", ["text", "nothing"])
def test_non_number_reward_is_an_error(fn):
    with pytest.raises(RewardError, match="not a number, on row 0 \\(sample_id 10"):
        _stage(functions=[f"stage_rewards:{fn}"])(_batch(), COMPLETIONS, ITEMS)


def test_long_prompts_are_excerpted():
    long = TaskItem("x" * 100, "2", {"id": "L"})
    with pytest.raises(RewardError, match="prompt 'x{57}\\.\\.\\.'\\)"):
        _stage(functions=["stage_rewards:nan_on_six"]).score(["6"], [long])


def test_batch_misalignment_errors():
    stage = _stage()
    with pytest.raises(ValueError, match="batch has 4 rows but got 3 completions"):
        stage(_batch(), COMPLETIONS[:3], ITEMS)
    with pytest.raises(ValueError, match="rows 0 and 1 share group_id 7 but have different"):
        stage(_batch(), COMPLETIONS, [G0, G1, G1, G1])
    with pytest.raises(ValueError, match="expected 3"):
        _stage(group_size=3)(_batch(), COMPLETIONS, ITEMS)  # incomplete groups


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"verifier": "regex"}, "verifier must be one of"),
        ({"group_size": 1}, "group_size must be an int >= 2"),
        ({"advantage_eps": 0.0}, "advantage_eps must be > 0"),
        ({"format_weight": math.nan}, "format_weight must be finite"),
        ({"functions": "stage_rewards:minus_len"}, "must be a list"),
        ({"functions": ["stage_rewards:minus_len"] * 2}, "twice"),
        ({"functions": ["stage_rewards:absent"]}, "has no attribute 'absent'"),
        ({"dtype": torch.int64}, "dtype must be floating"),
    ],
)
def test_bad_construction(kw, needle):
    with pytest.raises(ValueError, match=needle):
        _stage(**kw)


def test_evaluate_reports_held_out_metrics():
    stage = _stage(functions=[])
    m = stage.metrics_of(stage.score(COMPLETIONS, ITEMS))
    assert m == {
        "accuracy": 0.75,
        "reward_mean": pytest.approx((1 + 0.5 + 1.5 + 1.5) / 4),
        "format_frac": 0.75,
    }


def test_overlong_punishment_by_hand():
    # max_tokens 3, buffer 2: the ramp starts after 1 token; lengths (3, 2, 3, 3) lose
    # 0.8 * min(1, (L - 1) / 2) = (0.8, 0.4, 0.8, 0.8).
    stage = _stage(overlong_buffer=2, overlong_penalty=0.8, max_tokens=3, estimator="dr_grpo")
    plain = _stage()(_batch(), COMPLETIONS, ITEMS)
    out = stage(_batch(), COMPLETIONS, ITEMS)
    torch.testing.assert_close(
        out.batch.rewards,
        plain.batch.rewards - torch.tensor([0.8, 0.4, 0.8, 0.8], dtype=torch.float64),
    )
    torch.testing.assert_close(out.scores.rewards, out.batch.rewards)
    # group 7 rewards 0.1 and -0.8: mean -0.35, so dr_grpo gives +-0.45; group 2 stays flat.
    torch.testing.assert_close(
        out.batch.advantages, torch.tensor([0.45, -0.45, 0.0, 0.0], dtype=torch.float64)
    )
    assert out.metrics["reward/overlong_penalty_mean"] == pytest.approx(2.8 / 4)


def test_overlong_fraction_ramp():
    from posttrain.reward.stage import overlong_fraction

    lengths = torch.tensor([0.0, 6.0, 7.0, 8.0, 9.0, 10.0], dtype=torch.float64)
    assert overlong_fraction(lengths, 10, 4).tolist() == [0.0, 0.0, 0.25, 0.5, 0.75, 1.0]
    with pytest.raises(ValueError, match="overlong_buffer=4 must lie in 1..max_tokens"):
        _stage(overlong_buffer=4, max_tokens=3)


def test_mask_truncated_drops_rows_from_the_loss_not_from_the_baseline():
    truncated = torch.tensor([False, True, False, False])
    plain = _stage()(_batch(), COMPLETIONS, ITEMS, truncated=truncated)
    out = _stage(mask_truncated=True)(_batch(), COMPLETIONS, ITEMS, truncated=truncated)
    torch.testing.assert_close(out.batch.advantages, plain.batch.advantages)
    want = _batch().response_mask.clone()
    want[1] = False
    assert torch.equal(out.batch.response_mask, want)
    with pytest.raises(ValueError, match="mask_truncated needs the rollout's truncated flags"):
        _stage(mask_truncated=True)(_batch(), COMPLETIONS, ITEMS)
