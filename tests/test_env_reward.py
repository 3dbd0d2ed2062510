"""The environment's reward as a term of a multi-turn trajectory's score (issue 21, item 4).

Episodes -> ``episodes_rollout`` (the ``env_reward`` column) -> the reward stage, hand-computed;
non-finite rewards fail in one line naming the row or the item and turn; dynamic sampling keeps
a group that only the environment's reward makes informative; a GRPO run logs the term.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from multiturn_fixtures import build_tools_model

from posttrain.data.tasks import TaskItem
from posttrain.env import EnvironmentFailedError, EnvStep
from posttrain.env.chat_template import build_tools_tokenizer
from posttrain.env.episode import Episode, EpisodeBatch, EpisodeLimits
from posttrain.reward import RewardError, RewardStage
from posttrain.reward.dynamic_sampling import sample_step
from posttrain.rollout.multiturn import episodes_rollout

TOK = build_tools_tokenizer()
ITEM_A = TaskItem("1+1=", "2", {"id": "a"})
ITEM_B = TaskItem("2+3=", "5", {"id": "b"})


def _episode(answer: str, reward: float | None) -> Episode:
    """A two-turn episode: prompt, a call, an observation, the final ``answer``."""
    prompt = TOK("U:1+1=", add_special_tokens=False).input_ids
    call = TOK("<tool_call>1+1</tool_call>", add_special_tokens=False).input_ids
    obs = TOK("U:2", add_special_tokens=False).input_ids
    final = TOK(answer, add_special_tokens=False).input_ids
    ids = [*prompt, *call, *obs, *final]
    mask = [0] * len(prompt) + [1] * len(call) + [0] * len(obs) + [1] * len(final)
    return Episode(ids, mask, len(prompt), 2, reward, {"tool_calls": 1}, [], None, True)


def _rollout(answers, rewards):
    episodes = [_episode(a, r) for a, r in zip(answers, rewards, strict=True)]
    logprobs = {i: [-0.5] * sum(e.mask) for i, e in enumerate(episodes)}
    groups = torch.arange(len(episodes) // 2)
    return episodes_rollout(episodes, logprobs, TOK, 2, groups)


def _stage(**kw) -> RewardStage:
    args = dict(verifier="exact", format_weight=0.0, group_size=2, dtype=torch.float64,
                functions=["posttrain.reward.shaping:numeric_closeness"])  # fmt: skip
    return RewardStage(**{**args, **kw})


def test_score_sums_the_environment_reward_with_the_verifier_and_functions() -> None:
    # rows: (right, env 0.25), (wrong "3": closeness 0.1 + 0.2 * 0.9 = 0.28, env None -> 0),
    #       (wrong "9": 0.1 + 0.2 * 0.6 = 0.22, env -0.5), (right, env 1.5)
    rollout = _rollout(["2", "3", "9", "5"], [0.25, None, -0.5, 1.5])
    assert rollout.batch.columns["env_reward"].tolist() == [0.25, 0.0, -0.5, 1.5]
    items = [ITEM_A, ITEM_A, ITEM_B, ITEM_B]
    result = _stage()(rollout.batch, list(rollout.texts), items, truncated=rollout.truncated)
    want = torch.tensor([1.0 + 0.25, 0.28, 0.22 - 0.5, 1.0 + 1.5], dtype=torch.float64)
    assert torch.allclose(result.scores.rewards, want, atol=1e-12)
    assert result.scores.env.tolist() == [0.25, 0.0, -0.5, 1.5]
    assert result.metrics["reward/env_mean"] == pytest.approx((0.25 - 0.5 + 1.5) / 4)
    assert result.metrics["reward/mean"] == pytest.approx(float(want.mean()))
    # group advantages over the combined score, as without an environment (GRPO: z-score)
    for rows in ((0, 1), (2, 3)):
        r = want[list(rows)]
        z = (r - r.mean()) / (r.std(unbiased=True) + 1e-6)
        assert torch.allclose(result.batch.advantages[list(rows)], z, atol=1e-9)
    assert result.batch.rewards.tolist() == pytest.approx(want.tolist())


def test_single_turn_scores_have_no_environment_term() -> None:
    scores = _stage().score(["2"], [ITEM_A])
    assert scores.env is None and scores.rewards.tolist() == [1.0]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_environment_reward_in_the_batch_names_the_row(bad) -> None:
    rollout = _rollout(["2", "3"], [0.0, 0.0])
    rollout.batch.columns["env_reward"][1] = bad
    with pytest.raises(RewardError) as e:
        _stage().rollout_scores(rollout.batch, list(rollout.texts), [ITEM_A, ITEM_A])
    assert str(e.value) == (
        f"the environment's reward returned {bad} on row 1 (sample_id 1, item a, prompt "
        "'1+1='): rewards must be finite"
    )


class _NanOnSecondTurn:
    def reset(self, item):
        return [{"role": "user", "content": item["prompt"]}]

    def step(self, messages):
        if len(messages) > 2:
            return EnvStep(done=True, reward=math.nan)
        return EnvStep([{"role": "user", "content": "1"}], reward=0.5)


def test_a_non_finite_step_reward_names_the_item_and_turn() -> None:
    batch = EpisodeBatch([{"prompt": "1+1="}], _NanOnSecondTurn, TOK, EpisodeLimits(3, 4, 100))
    eos = TOK.eos_token_id
    batch.requests()
    batch.advance([[5, eos]])
    batch.requests()
    with pytest.raises(EnvironmentFailedError) as e:
        batch.advance([[6, eos]])
    assert str(e.value) == "environment on item 0 turn 2: reward nan is not a finite number"


def test_episode_reward_sums_its_steps() -> None:
    class TwoRewards(_NanOnSecondTurn):
        def step(self, messages):
            done = len(messages) > 2
            return EnvStep([] if done else [{"role": "user", "content": "1"}], done, 0.25)

    batch = EpisodeBatch([{"prompt": "1+1="}], TwoRewards, TOK, EpisodeLimits(3, 4, 100))
    eos = TOK.eos_token_id
    for out in ([5, eos], [6, eos]):
        batch.requests()
        batch.advance([out])
    assert batch.episodes()[0].reward == 0.5


def test_dynamic_sampling_sees_the_combined_score() -> None:
    """Both groups' verifier and function scores are flat; only group B's environment rewards
    differ, so dynamic sampling keeps exactly that group."""
    stage = _stage(functions=[])
    items = [ITEM_A, ITEM_B]

    def generate(batch_items, rnd):
        assert [it.item_id for it in batch_items] == ["a", "b"]
        return _rollout(["2", "2", "7", "7"], [0.5, 0.5, 0.0, 1.0])

    def score(rollout, batch_items):
        rows = [batch_items[i] for i in rollout.prompt_index.tolist()]
        return stage.rollout_scores(rollout.batch, list(rollout.texts), rows)

    sampled = sample_step(0, prompts=2, take=lambda c, k: (items, c + k), generate=generate,
                          score=score, dynamic=True, max_rounds=1)  # fmt: skip
    assert [it.item_id for it in sampled.items] == ["b"]
    assert sampled.scores.env.tolist() == [0.0, 1.0]
    assert sampled.scores.rewards.tolist() == [0.0, 1.0]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tools_model(tmp_path_factory.mktemp("tools") / "model")


def test_a_grpo_run_trains_on_the_environment_reward(tmp_path, model_dir) -> None:
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.entrypoints import grpo

    opts = {
        "job.name": "env-reward", "job.output_root": str(tmp_path / "out"),
        "model.name_or_path": str(model_dir), "data.train_size": 16, "data.val_size": 4,
        "data.prompts_per_step": 2, "rollout.n": 4, "rollout.max_tokens": 6, "rl.max_steps": 2,
        "rl.save_every": 2, "rl.eval_every": 2, "rl.micro_batch_size": 8,
        "logging.progress": False, "env.name": "env_reward_fixtures:length_paid",
        "env.max_turns": 2, "env.max_context": 120,
    }  # fmt: skip
    opts = [f"{k}={v}" for k, v in opts.items()]
    config = load_config("arithmetic", ["--", *opts])
    summary = grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config), build_objective)
    run = Path(summary["run_dir"])
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 2 and steps[0]["train/loss"] != 0.0  # the env reward varies by length
    for r in steps:
        assert r["train/reward_env_mean"] > 0
        # the verifier never scores these random answers, so the mean is the environment's
        assert r["train/reward_mean"] == pytest.approx(r["train/reward_env_mean"])
    assert rows[-1]["val/reward_mean"] > 0  # held-out scoring reads it too
    samples = [
        json.loads(x) for x in (run / "samples" / "step_000002.jsonl").read_text().splitlines()
    ]
    assert all(s["reward"] == s["env_reward"] for s in samples)
