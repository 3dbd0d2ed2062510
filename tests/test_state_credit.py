"""Per-state credit (``rl.credit=state``): a later turn is judged only against the rows of its
group that reached the same state (the same tokens before that turn); a state one row alone
reached gets advantage 0. Where every row reaches every turn through the same tokens, it is
``rl.credit=turn`` bit for bit."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_turn_credit import _episode, _stage

from posttrain.algorithm.annotators.advantage import turn_advantages
from posttrain.data.tasks import TaskItem
from posttrain.env.chat_template import build_tools_tokenizer
from posttrain.reward.stage import TURN_COLUMN
from posttrain.rollout.multiturn import episodes_rollout

F64 = torch.float64

# One group of five rows, tokens by turn (0: the environment's tokens or padding), ids below:
#   rows 0-2 call with ids [7, 8] and see the tool's [9]: one state before turn 2
#   row 3 calls [7, 5] and sees [4]: a state of its own
#   row 4 answers at once and ends after turn 1
TURN = torch.tensor([[1, 1, 0, 2], [1, 1, 0, 2], [1, 1, 0, 2], [1, 1, 0, 2], [1, 0, 0, 0]])
IDS = torch.tensor([[7, 8, 9, 3], [7, 8, 9, 1], [7, 8, 9, 2], [7, 5, 4, 2], [6, 0, 0, 0]])
# environment rewards: the call 1.0 (rows 0-2), 0.3 (row 3), 0.1 (row 4); the answers 0.8, 0.2,
# 0.0 and 0.0; the verifier pays row 0's answer 1.0 (the rest of the score, at the last turn)
CALL = torch.tensor([1.0, 1.0, 1.0, 0.3, 0.1], dtype=F64)
ANSWER = torch.tensor([0.8, 0.2, 0.0, 0.0, 0.0], dtype=F64)
TOTAL = CALL + ANSWER + torch.tensor([1.0, 0, 0, 0, 0], dtype=F64)
PER = torch.where(TURN == 1, CALL[:, None], torch.where(TURN == 2, ANSWER[:, None], 0.0))
GROUP = torch.zeros(5, dtype=torch.int64)


def test_state_advantages_by_hand_dr_grpo() -> None:
    adv, stats = turn_advantages(TOTAL, TURN, PER, GROUP, group_size=5, estimator="dr_grpo",
                                 input_ids=IDS)  # fmt: skip
    # turn 1: the whole group, totals [2.8, 1.2, 1.0, 0.3, 0.1], mean 1.08
    first = TOTAL - TOTAL.mean()
    # turn 2, rows 0-2 (one state): returns [1.8, 0.2, 0.0], mean 2/3; row 3 alone: 0
    second = torch.tensor([1.8 - 2 / 3, 0.2 - 2 / 3, -2 / 3, 0.0, 0.0], dtype=F64)
    want = torch.where(TURN == 1, first[:, None], torch.where(TURN == 2, second[:, None], 0.0))
    torch.testing.assert_close(adv, want, rtol=0, atol=1e-12)
    assert stats == {"zero_variance_group_frac": 0.0, "later_turn_alone_frac": 0.25}
    # per-turn credit sets turn 2's baseline over all five rows (row 4's return to go is 0)
    turn, _ = turn_advantages(TOTAL, TURN, PER, GROUP, group_size=5, estimator="dr_grpo")
    to_go = torch.tensor([1.8, 0.2, 0.0, 0.0, 0.0], dtype=F64)
    assert turn[0, 3].item() == pytest.approx(1.8 - to_go.mean().item(), abs=1e-12)
    assert turn[3, 3].item() == pytest.approx(-0.4, abs=1e-12)  # judged against rows 0-2


def test_state_advantages_grpo_divide_by_the_states_own_std() -> None:
    adv, _ = turn_advantages(TOTAL, TURN, PER, GROUP, group_size=5, input_ids=IDS)
    dev = torch.tensor([1.8, 0.2, 0.0], dtype=F64) - 2 / 3
    s = math.sqrt(float((dev**2).sum()) / 2)
    torch.testing.assert_close(adv[:3, 3], dev / (s + 1e-6), rtol=0, atol=1e-12)
    assert adv[3, 3].item() == 0.0


def test_the_same_tokens_in_two_groups_are_two_states() -> None:
    # rows 0-1 in group 0, rows 2-3 in group 1, all with the same tokens before turn 2
    turn = torch.tensor([[1, 0, 2]] * 4)
    ids = torch.tensor([[5, 6, 1], [5, 6, 2], [5, 6, 1], [5, 6, 2]])
    answer = torch.tensor([1.0, 0.0, 3.0, 2.0], dtype=F64)
    per = torch.where(turn == 2, answer[:, None], 0.0)
    groups = torch.tensor([0, 0, 1, 1])
    adv, stats = turn_advantages(answer, turn, per, groups, group_size=2, estimator="dr_grpo",
                                 input_ids=ids)  # fmt: skip
    assert adv[:, 2].tolist() == [0.5, -0.5, 0.5, -0.5]  # one batch-wide state would give +-1.5
    assert stats["later_turn_alone_frac"] == 0.0


def test_a_state_is_every_token_before_the_turn_the_prompt_and_tool_results_included() -> None:
    # one group of six rows; three turns; ids are [prompt (2) | response (5)], turn 0 where the
    # environment speaks. Turn 3's states: rows 0-1 (all alike), row 2 (another tool result
    # after the same call), row 3 (another first turn, then the same as rows 0-1), row 4
    # (another prompt: a reset that varies), row 5 (alike rows 0-1 again)
    turn = torch.tensor([[1, 0, 2, 0, 3]] * 6)
    ids = torch.tensor([
        [9, 9, 5, 6, 7, 8, 1], [9, 9, 5, 6, 7, 8, 2], [9, 9, 5, 4, 7, 8, 1],
        [9, 9, 3, 6, 7, 8, 1], [9, 8, 5, 6, 7, 8, 1], [9, 9, 5, 6, 7, 8, 3],
    ])  # fmt: skip
    last = torch.tensor([1.0, 0.0, 5.0, 5.0, 5.0, 2.0], dtype=F64)
    per = torch.where(turn == 3, last[:, None], 0.0)
    groups = torch.zeros(6, dtype=torch.int64)
    adv, stats = turn_advantages(last, turn, per, groups, group_size=6, estimator="dr_grpo",
                                 input_ids=ids)  # fmt: skip
    assert adv[:, 4].tolist() == pytest.approx([0.0, -1.0, 0.0, 0.0, 0.0, 1.0], abs=1e-12)
    # turn 2's state already holds the tool's first result: rows 2, 3 and 4 are alone at both
    assert stats["later_turn_alone_frac"] == pytest.approx((3 + 3) / 12)
    # with the batch's scaling the std is that of the returns of rows sharing a state
    batch, _ = turn_advantages(last, turn, per, groups, group_size=6, scaling="batch",
                               input_ids=ids)  # fmt: skip
    s = float(torch.tensor([1.0, 0.0, 2.0], dtype=F64).std())
    assert batch[5, 4].item() == pytest.approx(1.0 / (s + 1e-6), abs=1e-12)


def test_state_credit_with_the_batch_baseline_is_one_line() -> None:
    from posttrain.config.errors import ConfigValueError
    from posttrain.config.rl import RLConfig

    with pytest.raises(ConfigValueError) as e:
        RLConfig(credit="state", advantage_estimator="reinforce_pp")
    assert str(e.value).startswith(
        "invalid config value rl: rl.credit=state judges a turn against the rows in its "
        "state, a group baseline; rl.advantage_estimator=reinforce_pp's is the batch's: use "
        "grpo, rloo or dr_grpo, or rl.credit=turn"
    ) and "\n" not in str(e.value)


@settings(max_examples=40, deadline=None)
@given(
    n_groups=st.integers(1, 3),
    size=st.integers(2, 5),
    turns=st.integers(1, 3),
    estimator=st.sampled_from(["grpo", "rloo", "dr_grpo"]),
    seed=st.integers(0, 2**16),
)
def test_one_shared_state_per_turn_is_per_turn_credit_bit_for_bit(
    n_groups, size, turns, estimator, seed
) -> None:
    g = torch.Generator().manual_seed(seed)
    n = n_groups * size
    turn = torch.arange(1, turns + 1).repeat_interleave(2).repeat(n, 1)  # two tokens a turn
    group_ids = torch.arange(n_groups).repeat_interleave(size)
    ids = torch.randint(0, 9, (n_groups, turn.shape[1]), generator=g)[group_ids]
    ids[:, 1::2] = torch.randint(0, 9, (n, turns), generator=g)  # each turn's last token differs
    ids[:, 0::2] = ids[:1, 0::2]  # the tokens before each turn's last are the same everywhere
    ids[:, 1::2][:, :-1] = ids[:1, 1::2][:, :-1]  # and so are every turn's but the last one's
    per_turn = torch.rand(n, turns, generator=g, dtype=F64)
    per = per_turn.repeat_interleave(2, 1)
    rewards = per_turn.sum(1) + torch.rand(n, generator=g, dtype=F64)
    kw = dict(group_size=size, estimator=estimator)
    by_state, stats = turn_advantages(rewards, turn, per, group_ids, **kw, input_ids=ids)
    by_turn, _ = turn_advantages(rewards, turn, per, group_ids, **kw)
    assert torch.equal(by_state, by_turn)
    assert stats.get("later_turn_alone_frac") == (0.0 if turns > 1 else None)


def test_the_reward_stage_judges_the_answer_against_its_state_only() -> None:
    # two rows make the same call and see the same result, a third calls wrong: under per-state
    # credit the wrong call's answer turn is alone (0) and the right calls' answers are judged
    # against each other only (+-1/sqrt(2) by the sign of their difference)
    eps = [_episode("2", 1.0, 0.2), _episode("7", 1.0, 0.0), _episode("7", 1.0, 0.0)]
    tok = build_tools_tokenizer()
    wrong = tok("<tool_call>1-1</tool_call>", add_special_tokens=False).input_ids
    start = eps[2].prompt_len
    eps[2].ids[start : start + len(wrong)] = wrong  # same length as the right call
    roll = episodes_rollout(eps, {i: [-1.0] * sum(e.mask) for i, e in enumerate(eps)}, tok, 3,
                            torch.arange(1))  # fmt: skip
    stage = _stage("state")
    stage.group_size = 3
    out = stage(roll.batch, ["2", "7", "7"], [TaskItem("1+1=", "2")] * 3)
    t = roll.batch.columns[TURN_COLUMN]
    answers = [out.batch.advantages[i, t[i] == 2] for i in range(3)]
    assert (answers[0] > 0.7).all() and (answers[1] < -0.7).all() and (answers[2] == 0).all()
    assert out.metrics["reward/later_turn_alone_frac"] == pytest.approx(1 / 3)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from multiturn_fixtures import build_tools_model

    return build_tools_model(tmp_path_factory.mktemp("tools") / "model")


def test_a_run_with_state_credit_trains_and_publishes_the_alone_share(tmp_path, model_dir) -> None:
    from test_multiturn import _run

    rows = _run(tmp_path, model_dir, "sc-run", **{"rl.credit": "state"})
    trained = [r for r in rows if "train/loss" in r]
    assert len(trained) == 2 and all(math.isfinite(r["train/loss"]) for r in trained)
    assert all(0.0 <= r["train/reward_later_turn_alone_frac"] <= 1.0 for r in trained)
