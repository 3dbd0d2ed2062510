"""Per-turn credit (``rl.credit=turn``): each turn's tokens get the group advantage of the
reward earned from that turn on; one-turn trajectories get the sequence-level path bit for bit."""

from __future__ import annotations

import math

import pytest
import torch
from multiturn_fixtures import build_tools_model

from posttrain.algorithm.annotators.advantage import group_advantages, turn_advantages
from posttrain.algorithm.primitives.policy_gradient import clipped_policy_gradient_loss
from posttrain.config import PosttrainConfig
from posttrain.control import run_preflight
from posttrain.data.tasks import TaskItem
from posttrain.env.chat_template import build_tools_tokenizer
from posttrain.env.episode import Episode, EpisodeBatch, EpisodeLimits
from posttrain.reward import RewardStage
from posttrain.reward.stage import TURN_COLUMN, TURN_REWARD_COLUMN
from posttrain.rollout.multiturn import episodes_rollout

TOK = build_tools_tokenizer()

# Three trajectories of one group, tokens laid out by turn (0: environment or padding):
#   row 0: turn 1 earns 1.0, turn 2 earns 0.5, the verifier pays 1.0 (last turn): total 2.5
#   row 1: turn 1 earns 0.3, turn 2 earns 0.0, verifier 0: total 0.3
#   row 2: one turn, earns 0.2 and ends: total 0.2
TURN = torch.tensor([[1, 1, 0, 2, 2], [1, 0, 2, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.float64)
PER = torch.tensor(
    [[1.0, 1.0, 0, 0.5, 0.5], [0.3, 0, 0.0, 0, 0], [0.2, 0.2, 0, 0, 0]], dtype=torch.float64
)
TOTAL = torch.tensor([2.5, 0.3, 0.2], dtype=torch.float64)
GROUP = torch.zeros(3, dtype=torch.int64)


def test_reward_to_go_advantages_by_hand_dr_grpo() -> None:
    # G_1 = totals [2.5, 0.3, 0.2], mean 1.0 -> [1.5, -0.7, -0.8]
    # G_2 = [0.5 + 1.0, 0.0, 0 (ended)], mean 0.5 -> [1.0, -0.5, -0.5]
    adv, stats = turn_advantages(TOTAL, TURN, PER, GROUP, group_size=3, estimator="dr_grpo")
    want = torch.tensor(
        [[1.5, 1.5, 0, 1.0, 1.0], [-0.7, 0, -0.5, 0, 0], [-0.8, -0.8, 0, 0, 0]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(adv, want, rtol=0, atol=1e-12)
    assert stats == {"zero_variance_group_frac": 0.0}


def test_reward_to_go_advantages_by_hand_grpo_divides_each_turn_by_its_own_std() -> None:
    adv, _ = turn_advantages(TOTAL, TURN, PER, GROUP, group_size=3, eps=1e-6)
    s1 = math.sqrt((1.5**2 + 0.7**2 + 0.8**2) / 2)  # 1.3
    s2 = math.sqrt((1.0**2 + 0.5**2 + 0.5**2) / 2)  # sqrt(0.75)
    assert adv[0, 0].item() == pytest.approx(1.5 / (s1 + 1e-6), abs=1e-12)
    assert adv[1, 0].item() == pytest.approx(-0.7 / (s1 + 1e-6), abs=1e-12)
    assert adv[0, 3].item() == pytest.approx(1.0 / (s2 + 1e-6), abs=1e-12)
    assert adv[1, 2].item() == pytest.approx(-0.5 / (s2 + 1e-6), abs=1e-12)


@pytest.mark.parametrize(
    "estimator,scaling",
    [("grpo", "group"), ("grpo", "batch"), ("rloo", "group"), ("dr_grpo", "group"),
     ("reinforce_pp", "group")],
)  # fmt: skip
def test_one_turn_each_is_the_sequence_level_path_bit_for_bit(estimator, scaling) -> None:
    g = torch.Generator().manual_seed(3)
    n, r = 12, 7
    rewards = torch.rand(n, generator=g, dtype=torch.float64) * 3
    groups = torch.arange(n // 4).repeat_interleave(4)
    lengths = torch.randint(1, r + 1, (n,), generator=g)
    mask = torch.arange(r)[None] < lengths[:, None]
    turn = mask.to(torch.float64)
    per = turn * torch.rand(n, 1, generator=g, dtype=torch.float64)  # the env's part of it
    kw = dict(group_size=4, estimator=estimator, scaling=scaling)
    seq, seq_stats = group_advantages(rewards, groups, **kw)
    tok, tok_stats = turn_advantages(rewards, turn, per, groups, **kw)
    assert torch.equal(tok[mask], seq[:, None].expand(n, r)[mask]) and seq_stats == tok_stats
    logp = torch.randn(n, r, generator=g, dtype=torch.float64)
    old = logp + 0.1 * torch.randn(n, r, generator=g, dtype=torch.float64)
    a, _ = clipped_policy_gradient_loss(logp, old, seq, mask, epsilon_low=0.2, epsilon_high=0.2)
    b, _ = clipped_policy_gradient_loss(logp, old, tok, mask, epsilon_low=0.2, epsilon_high=0.2)
    assert torch.equal(a[mask], b[mask])


def test_a_later_turn_is_not_scaled_by_the_first_turns_variance() -> None:
    # the first turn's rewards differ wildly, the answers' only by 0.1: the answer turn's
    # advantages are +-1/sqrt(2)-ish, not ~0 as under one sequence-level advantage
    turn = torch.tensor([[1, 0, 2]] * 4, dtype=torch.float64)
    first = torch.tensor([0.0, 10.0, 0.0, 10.0], dtype=torch.float64)
    answer = torch.tensor([0.1, 0.1, 0.0, 0.0], dtype=torch.float64)
    per = torch.stack([first, torch.zeros(4, dtype=torch.float64), answer], 1)
    groups = torch.zeros(4, dtype=torch.int64)
    adv, _ = turn_advantages(first + answer, turn, per, groups, group_size=4)
    seq, _ = group_advantages(first + answer, groups, group_size=4)
    assert adv[:, 2].abs().min() > 0.8 and seq.abs().min() > 0.8  # the call's sign dominates seq
    assert torch.equal(torch.sign(adv[:, 2]), torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=adv.dtype))
    assert torch.equal(adv[:, 0], seq)


class _TwoTurns:
    """Turn 1 earns 0.25 and continues; turn 2 earns 0.5 and ends."""

    def reset(self, item):
        return [{"role": "user", "content": str(item["prompt"])}]

    def step(self, messages):
        from posttrain.env import EnvStep

        if len(messages) == 2:
            return EnvStep([{"role": "user", "content": "ok"}], False, 0.25)
        return EnvStep([], True, 0.5)


def test_episodes_carry_each_turns_reward_into_per_token_columns() -> None:
    eos = TOK.eos_token_id
    batch = EpisodeBatch([{"prompt": "1+1="}], _TwoTurns, TOK, EpisodeLimits(3, 4, 200))
    for turn in (["1"], ["2", "2"]):
        assert len(batch.requests()) == 1
        batch.advance([[*TOK.convert_tokens_to_ids(turn), eos]])
    assert batch.requests() == []
    (ep,) = batch.episodes()
    assert ep.turn_rewards == [0.25, 0.5] and ep.reward == 0.75
    roll = episodes_rollout([ep, ep], {0: [-1.0] * 5, 1: [-1.0] * 5}, TOK, 2, torch.arange(1))
    turn = roll.batch.columns[TURN_COLUMN][0]
    per = roll.batch.columns[TURN_REWARD_COLUMN][0]
    mask = roll.batch.response_mask[0]
    assert turn[mask].tolist() == [1, 1, 2, 2, 2] and (turn[~mask] == 0).all()
    assert per[mask].tolist() == [0.25, 0.25, 0.5, 0.5, 0.5]


def _stage(credit: str) -> RewardStage:
    return RewardStage(verifier="exact", format_weight=0.0, functions=[], group_size=2,
                       dtype=torch.float64, credit=credit)  # fmt: skip


def _episode(answer: str, call_reward: float, answer_reward: float) -> Episode:
    prompt = TOK("U:1+1=", add_special_tokens=False).input_ids
    call = TOK("<tool_call>1+1</tool_call>", add_special_tokens=False).input_ids
    obs = TOK("U:2", add_special_tokens=False).input_ids
    final = TOK(answer, add_special_tokens=False).input_ids
    ids = [*prompt, *call, *obs, *final]
    mask = [0] * len(prompt) + [1] * len(call) + [0] * len(obs) + [1] * len(final)
    reward = call_reward + answer_reward
    return Episode(ids, mask, len(prompt), 2, reward, {}, [], None, True,
                   [call_reward, answer_reward])  # fmt: skip


def test_the_stage_pays_the_verifier_at_the_last_turn() -> None:
    # row 0: call 1.0, answer 0.2 + verifier 1 ("2" is right); row 1: call 0.3, answer 0, wrong
    eps = [_episode("2", 1.0, 0.2), _episode("7", 0.3, 0.0)]
    roll = episodes_rollout(eps, {i: [-1.0] * sum(e.mask) for i, e in enumerate(eps)}, TOK, 2,
                            torch.arange(1))  # fmt: skip
    items = [TaskItem("1+1=", "2")] * 2
    turn = _stage("turn")(roll.batch, ["2", "7"], items).batch
    seq = _stage("trajectory")(roll.batch, ["2", "7"], items).batch
    assert seq.advantages.shape == (2,) and turn.advantages.shape == roll.batch.response_mask.shape
    assert turn.rewards.tolist() == [2.2, 0.3] == seq.rewards.tolist()
    t = roll.batch.columns[TURN_COLUMN]
    # two members: every advantage is +-1/sqrt(2) (up to eps) with the sign of the difference;
    # turn 2's returns are 1.2 vs 0.0, turn 1's 2.2 vs 0.3
    for k in (1, 2):
        a = turn.advantages[t == k].reshape(-1)
        assert (a[: (t[0] == k).sum()] > 0.7).all() and (a[(t[0] == k).sum() :] < -0.7).all()
    assert torch.equal(
        turn.advantages[0, t[0] == 1], seq.advantages[0].expand(int((t[0] == 1).sum()))
    )


def test_turn_credit_without_the_per_turn_columns_is_one_line() -> None:
    eps = [_episode("2", 1.0, 0.2)] * 2
    roll = episodes_rollout(eps, {i: [-1.0] * sum(e.mask) for i, e in enumerate(eps)}, TOK, 2,
                            torch.arange(1))  # fmt: skip
    del roll.batch.columns[TURN_COLUMN]
    with pytest.raises(ValueError, match="credit='turn' needs a multi-turn rollout's per-turn"):
        _stage("turn")(roll.batch, ["2", "7"], [TaskItem("1+1=", "2")] * 2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tools_model(tmp_path_factory.mktemp("tools") / "model")


def _violations(**sections) -> list[str]:
    from posttrain.control.rules import PreflightError

    try:
        run_preflight(PosttrainConfig(**sections))
    except PreflightError as e:
        return list(e.violations)
    return []


def test_turn_credit_without_an_environment_is_refused_in_one_line() -> None:
    (line,) = _violations(rl={"credit": "turn"})
    assert line == (
        "rl.credit=turn is never read by rl.grpo_surrogate=clipped (one turn per response "
        "without env.name); reset with rl.credit=@default (-> 'trajectory')"
    ), line


def test_turn_credit_with_the_sequence_level_ratio_is_refused_in_one_line(model_dir) -> None:
    env = {"name": "role_fixtures:chatty", "max_turns": 3, "max_context": 120}
    rl = {"credit": "turn", "importance_sampling_level": "sequence", "epsilon_low": 3e-4,
          "epsilon_high": 4e-4, "mini_batch_per_replica": 2}  # fmt: skip
    lines = _violations(model={"name_or_path": str(model_dir)}, env=env, rl=rl)
    assert any(
        line.startswith(
            "rl.credit=turn is never read by rl.grpo_surrogate=clipped, "
            "rl.importance_sampling_level=sequence (the sequence-level ratio takes "
            "one advantage per response)"
        )  # fmt: skip
        for line in lines
    ), lines
    assert not _violations(model={"name_or_path": str(model_dir)}, env=env, rl={"credit": "turn"})


def test_kill_9_mid_run_then_resume_matches_the_straight_run_with_turn_credit(
    tmp_path, model_dir
) -> None:
    from test_multiturn import _comparable, _killed_at_save_2, _run

    knobs = {"rl.max_steps": 3, "rl.save_every": 1, "rl.eval_every": 3, "rl.credit": "turn"}
    straight = _comparable(_run(tmp_path / "a", model_dir, "tc-resume", **knobs))
    trajectory = _run(tmp_path / "c", model_dir, "tc-traj", **{**knobs, "rl.credit": "trajectory"})
    assert _comparable(trajectory) != straight  # the credit changes the loss
    _killed_at_save_2(lambda: _run(tmp_path / "b", model_dir, "tc-resume", **knobs))
    resumed = _comparable(_run(tmp_path / "b", model_dir, "tc-resume", **knobs))
    assert resumed == straight and len(straight) == 4  # steps 0 (eval) to 3
