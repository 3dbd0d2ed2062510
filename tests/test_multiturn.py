"""Multi-turn GRPO: KV-continued sampling, the policy-token mask in the loss, and the run."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from multiturn_fixtures import build_tools_model, worst_sampler_gap

from posttrain.algorithm.grpo import make_objective
from posttrain.algorithm.primitives.objective import OBJECTIVE_WEIGHT_SUM
from posttrain.config import PosttrainConfig
from posttrain.data.logprobs import response_logprobs
from posttrain.data.prefix import use_shared_prefix
from posttrain.data.tasks import TaskItem
from posttrain.env import EnvStep
from posttrain.env.chat_template import build_tools_tokenizer
from posttrain.env.episode import EpisodeBatch, EpisodeLimits
from posttrain.env.render import decode, encode
from posttrain.env.tools import calculator_environment
from posttrain.model.loading import load_policy
from posttrain.placement.roles import RewardRole, RolloutRole
from posttrain.rollout.multiturn import env_metrics, episodes_rollout, multiturn_rollout
from posttrain.testing import check_objective


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tools_model(tmp_path_factory.mktemp("tools") / "model")


def _config(model_dir: Path, **env) -> PosttrainConfig:
    env = {"name": "role_fixtures:chatty", "max_turns": 3, "max_context": 120, **env}
    return PosttrainConfig(
        model={"name_or_path": str(model_dir)}, rollout={"max_tokens": 6, "n": 2}, env=env
    )


def _rollout(model_dir: Path, seed: int = 0, **env):
    cfg = _config(model_dir, **env)
    model, tok = load_policy(str(model_dir), None, "float32", "cpu")
    roles = SimpleNamespace(reward=RewardRole(cfg), rollout=RolloutRole(cfg, model=model))
    items = [TaskItem(f"{a}+{a + 1}=", str(2 * a + 1)) for a in range(4)]
    fed: list[int] = []
    engine = roles.rollout.engine
    forward = engine._forward

    def counting(ids, mask, pos, cache):  # ids each forward feeds (mask 1 in its new columns)
        fed.append(int(mask[:, -ids.shape[1] :].sum()))
        return forward(ids, mask, pos, cache)

    engine._forward = counting
    out = multiturn_rollout(
        roles, items, tok, n=2, temperature=1.0, top_p=1.0, seed=seed, group_id_offset=0
    )
    return model, tok, out, sum(fed)


@pytest.fixture(scope="module")
def sampled(model_dir):
    return _rollout(model_dir)


def test_policy_logprobs_equal_a_full_sequence_recompute(sampled) -> None:
    model, _, rollout, fed = sampled
    b = rollout.batch
    turns = b.columns["env_turns"]
    # multi-turn, ending at different turns
    assert turns.max() >= 2 and len(set(turns.tolist())) > 1
    env_tokens = b.attention_mask[:, b.prompt_width :].sum() - b.response_mask.sum()
    assert env_tokens > 0
    assert worst_sampler_gap(model, b) <= 1e-6  # one unpadded forward per trajectory
    with torch.no_grad():
        # the trainer's padded forward, with and without prompt sharing, reads the same values
        m = b.response_mask
        for mode in ("off", "on"):
            with use_shared_prefix(mode):
                trained = response_logprobs(model, b)
            assert (trained[m] - b.rollout_logprobs[m]).abs().max() <= 1e-6
    # every id was fed to the model once (the last sampled one never), each distinct prompt once
    p_ids, p_on = b.input_ids[:, : b.prompt_width], b.attention_mask[:, : b.prompt_width].bool()
    prompts = {tuple(p_ids[i][p_on[i]].tolist()) for i in range(len(b))}
    assert len(prompts) < len(b)  # n=2: the prompt of a group is shared
    after = int(b.attention_mask[:, b.prompt_width :].sum())
    assert fed == sum(len(p) for p in prompts) + after - len(b)


def _with_advantages(batch):
    g = torch.Generator().manual_seed(0)
    return batch.replace(advantages=torch.randn(len(batch), generator=g, dtype=torch.float32))


def _objective(**rl):
    cfg = PosttrainConfig()
    for k, v in rl.items():
        setattr(cfg.rl, k, v)
    return cfg.rl


@pytest.mark.parametrize("knobs", [{}, {"kl_beta": 0.1, "entropy_coef": 0.01}])
def test_loss_gradient_on_environment_tokens_is_exactly_zero(sampled, knobs) -> None:
    model, _, rollout, _ = sampled
    model.zero_grad(set_to_none=True)
    batch = _with_advantages(rollout.batch)
    ctx = SimpleNamespace(max_response_length=6, reference_model=copy.deepcopy(model).eval())
    objective = make_objective(_objective(**knobs), ctx)
    kept = []

    def keep(module, inputs, out) -> None:
        out.retain_grad()
        kept.append(out)

    objective.old_logp_cache.follow_policy(batch)  # on-policy: π_old is the current policy
    hook = model.lm_head.register_forward_hook(keep)
    try:
        with use_shared_prefix("off"):  # one head call, over every response position
            loss, metrics = objective.fn(model, batch)
        loss.backward()
    finally:
        hook.remove()
    grad = kept[-1].grad[:, :-1]  # row t predicts response token t
    env = ~batch.response_mask
    assert grad[env].abs().max() == 0.0  # exactly: environment tokens are context only
    assert grad[batch.response_mask].abs().max() > 0
    # TOKEN_SUM's weight (token-mean: the tokens that carry loss) counts policy tokens only
    attended = int(batch.attention_mask[:, batch.prompt_width :].sum())
    assert float(metrics[OBJECTIVE_WEIGHT_SUM]) == int(batch.response_mask.sum()) < attended


def test_multiturn_objective_is_split_invariant(sampled) -> None:
    model, _, rollout, _ = sampled
    batch = _with_advantages(rollout.batch)
    objective = make_objective(_objective(), SimpleNamespace(max_response_length=6))
    check_objective(objective, model, batch, splits=(2, 3, 8))


def test_sampled_ids_are_trained_as_sampled_never_retokenised() -> None:
    """The policy spells ``<tool_call>`` one character id at a time; re-encoding its text
    would merge those into one marker id. The batch holds the sampled ids."""
    tok = build_tools_tokenizer()
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "12+7"}}</tool_call>'
    sampled = [tok.convert_tokens_to_ids(c) for c in text] + [tok.eos_token_id]
    assert encode(tok, decode(tok, sampled)) != sampled  # re-tokenising would change them
    answer = [tok.convert_tokens_to_ids(c) for c in "19"] + [tok.eos_token_id]
    limits = EpisodeLimits(max_turns=3, max_turn_tokens=200, max_context=400)
    eps = EpisodeBatch([{"prompt": "12+7?"}], calculator_environment, tok, limits)
    for turn in (sampled, answer):
        assert eps.requests()
        eps.advance([turn])
    assert not eps.requests()
    (ep,) = eps.episodes()
    lps = {0: [-0.5] * (len(sampled) + len(answer))}
    rollout = episodes_rollout([ep], lps, tok, 1, torch.zeros(1, dtype=torch.int64))
    b = rollout.batch
    assert b.response_ids[0][b.response_mask[0]].tolist() == sampled + answer
    assert b.columns["env_tool_calls"].tolist() == [1.0] and rollout.texts == ("19",)
    metrics = env_metrics(b)
    assert metrics["env/turns_mean"] == 2 and metrics["env/tool_errors_mean"] == 0
    assert metrics["env/tool_calls_mean"] == 1 and metrics["env/tool_timeouts_mean"] == 0
    assert metrics["env/env_tokens_mean"] > 0
    assert metrics["env/policy_tokens_mean"] == len(sampled) + len(answer)


class Scorer:
    """A user environment with two custom info keys: ``call_right`` on a first turn of 'A',
    ``answer_hits`` (a fraction) on the answer after it; a first turn 'stop' ends with no info."""

    info_keys = ("call_right", "answer_hits")

    def reset(self, item):
        return [{"role": "user", "content": item["prompt"]}]

    def step(self, messages):
        if messages[-1]["content"] == "stop":
            return EnvStep(done=True)
        if len(messages) == 2:
            right = int(messages[-1]["content"] == "A")
            return EnvStep([{"role": "user", "content": "ok"}], info={"call_right": right})
        return EnvStep(done=True, info={"answer_hits": 0.25 * len(messages[-1]["content"])})


def _scored(tok, scripts: list[list[str]], group: int = 0):
    """``episodes_rollout`` of :class:`Scorer` episodes with ``scripts`` (turn texts per row,
    n=2), the rows in one group each pair."""
    eps = EpisodeBatch([{"prompt": "1+1="}] * len(scripts), Scorer, tok, EpisodeLimits(3, 20, 200))
    turns = [list(s) for s in scripts]
    while requests := eps.requests():
        outs = [[tok.convert_tokens_to_ids(c) for c in turns[r.key].pop(0)] + [tok.eos_token_id]
                for r in requests]  # fmt: skip
        eps.advance(outs)
    episodes = eps.episodes()
    lps = {i: [-0.5] * sum(e.mask) for i, e in enumerate(episodes)}
    groups = torch.arange(len(scripts) // 2, dtype=torch.int64) + group
    return episodes_rollout(episodes, lps, tok, 2, groups, sample_id_offset=10 * group)


def test_custom_info_keys_become_columns_and_metrics() -> None:
    tok = build_tools_tokenizer()
    rollout = _scored(tok, [["A", "12"], ["B", "1"], ["stop"], ["A", "1234"]])
    c = rollout.batch.columns
    assert c["env_call_right"].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert c["env_answer_hits"].tolist() == [0.5, 0.25, 0.0, 1.0]  # 0: never reported
    assert c["env_turns"].tolist() == [2.0, 2.0, 1.0, 2.0]
    m = env_metrics(rollout.batch)
    assert m["env/call_right_mean"] == 0.5 and m["env/answer_hits_mean"] == 0.4375
    assert m["env/turns_mean"] == 1.75 and "env/tool_calls_mean" not in m
    assert sorted(k for k in m if k.endswith("_mean")) == [
        "env/answer_hits_mean", "env/call_right_mean", "env/dropped_observations_mean",
        "env/env_tokens_mean", "env/policy_tokens_mean", "env/turns_mean",
    ]  # fmt: skip
    # the same columns when no row of a batch reports a key (declared, so the set is fixed)
    quiet = _scored(tok, [["stop"], ["stop"]])
    assert sorted(quiet.batch.columns) == sorted(c)
    assert env_metrics(quiet.batch)["env/answer_hits_mean"] == 0.0


def test_dynamic_sampling_joins_rounds_with_custom_info_columns_aligned() -> None:
    """What dynamic sampling does with rounds (keep the informative groups of each, join them):
    the custom columns follow their rows, whatever the rounds' widths."""
    from posttrain.rollout.concat import concat_rollouts, keep_groups

    tok = build_tools_tokenizer()
    first = _scored(tok, [["A", "12"], ["stop"], ["B", "1"], ["A", "1"]])
    second = _scored(tok, [["stop"], ["A", "123456"]], group=2)
    kept = keep_groups(first, torch.tensor([False, True]))
    joined = concat_rollouts([kept, second])
    c = joined.batch.columns
    assert joined.batch.sample_ids.tolist() == [2, 3, 20, 21]
    assert c["env_call_right"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert c["env_answer_hits"].tolist() == [0.25, 0.25, 0.0, 1.5]
    assert env_metrics(joined.batch)["env/answer_hits_mean"] == 0.5


def _run(tmp: Path, model_dir: Path, name: str, **extra):
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.entrypoints import grpo

    opts = {
        "job.name": name, "job.output_root": str(tmp / "out"), "model.name_or_path": str(model_dir),
        "data.train_size": 16, "data.val_size": 4, "data.prompts_per_step": 2, "rollout.n": 4,
        "rollout.max_tokens": 6, "rl.max_steps": 2, "rl.save_every": 2, "rl.eval_every": 2,
        "rl.micro_batch_size": 8, "logging.progress": False, "env.name": "role_fixtures:chatty",
        "env.max_turns": 3, "env.max_context": 120,
        "reward.functions": "[role_fixtures:length_reward]", **extra,
    }  # fmt: skip
    opts = [f"{k}={v}" for k, v in opts.items()]
    config = load_config("arithmetic", ["--", *opts])
    summary = grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config), build_objective)
    rows = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(r) for r in rows]


def test_multiturn_grpo_run_logs_env_metrics_and_is_split_invariant(tmp_path, model_dir) -> None:
    whole = _run(tmp_path, model_dir, "mt-whole")
    split = _run(tmp_path, model_dir, "mt-split", **{"rl.micro_batch_size": 1})
    steps = [r for r in whole if "train/loss" in r]
    assert len(steps) == 2 and steps[0]["train/loss"] != 0.0
    for key in ("turns_mean", "nudges_mean", "policy_tokens_mean", "env_tokens_mean",
                "truncated_max_turns_frac", "truncated_turn_tokens_frac"):  # fmt: skip
        assert f"train/env/{key}" in steps[0] and f"val/env/{key}" in whole[-1]
    assert steps[0]["train/env/env_tokens_mean"] > 0
    # the environment's own key (a nudge per turn that ended at its stop token); no tool keys
    assert 0 < steps[0]["train/env/nudges_mean"] <= steps[0]["train/env/turns_mean"]
    assert not [k for k in steps[0] if "tool" in k]
    for a, b in zip(steps, [r for r in split if "train/loss" in r], strict=True):
        assert a["train/env/turns_mean"] == b["train/env/turns_mean"]  # same samples
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5, abs=1e-7)


def _killed_at_save_2(run) -> None:
    """``run()`` in a forked child, SIGKILLed as it writes step 2's checkpoint manifest."""
    import os
    import signal

    import posttrain.trainer.checkpoint as checkpoint_module

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child is killed (or exits) before returning
        try:
            torch.set_num_threads(1)
            real = checkpoint_module.write_manifest

            def die_at_2(d, step):
                if step == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                real(d, step)

            checkpoint_module.write_manifest = die_at_2
            run()
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == -signal.SIGKILL


def _comparable(rows: list[dict]) -> list[tuple]:
    keys = ("train/loss", "train/env/turns_mean", "train/env/env_tokens_mean", "val/accuracy")
    return [(r["step"], *(r.get(k) for k in keys)) for r in rows]


def test_kill_9_mid_run_then_resume_matches_the_straight_multiturn_run(tmp_path, model_dir) -> None:
    knobs = {"rl.max_steps": 3, "rl.save_every": 1, "rl.eval_every": 3}
    straight = _comparable(_run(tmp_path / "a", model_dir, "mt-resume", **knobs))
    _killed_at_save_2(lambda: _run(tmp_path / "b", model_dir, "mt-resume", **knobs))
    resumed = _comparable(_run(tmp_path / "b", model_dir, "mt-resume", **knobs))
    assert resumed == straight and len(straight) == 4  # steps 0 (eval) to 3


def test_max_context_beyond_the_model_positions_is_one_line(model_dir) -> None:
    from posttrain.config import ConfigError

    with pytest.raises(ConfigError) as e:
        RewardRole(_config(model_dir, max_context=4096))
    assert str(e.value) == (
        f"env.max_context=4096 exceeds the 512 positions of the model at {model_dir}; lower "
        "env.max_context to at most 512"
    )


def test_dynamic_sampling_keeps_multiturn_rows_and_columns_aligned(tmp_path, model_dir) -> None:
    knobs = {"rl.dynamic_sampling": "true", "rl.max_sampling_rounds": 4,
             "reward.functions": "[role_fixtures:some_groups_reward]"}  # fmt: skip
    steps = [r for r in _run(tmp_path, model_dir, "mt-dyn", **knobs) if "train/loss" in r]
    assert len(steps) == 2 and all("train/env/turns_mean" in r for r in steps)
    assert all(0 < r["train/env/nudges_mean"] <= r["train/env/turns_mean"] for r in steps)
    assert max(r["train/sampling/rounds"] for r in steps) > 1  # rounds were concatenated


def test_opd_trains_on_multiturn_trajectories(tmp_path, model_dir) -> None:
    from posttrain.config import load_config
    from posttrain.entrypoints import opd
    from posttrain.run.records import default_out_dir

    teacher = build_tools_model(tmp_path / "teacher", seed=1)
    opts = {
        "job.output_root": str(tmp_path / "out"), "model.name_or_path": str(model_dir),
        "teacher.name_or_path": str(teacher), "data.train_size": 16, "data.val_size": 4,
        "data.prompts_per_step": 2, "rollout.n": 4, "rollout.max_tokens": 6, "rl.max_steps": 2,
        "rl.save_every": 2, "rl.eval_every": 2, "rl.micro_batch_size": 8,
        "logging.progress": False, "env.name": "role_fixtures:chatty", "env.max_turns": 3,
        "env.max_context": 120, "rl.distillation_mode": "advantage",
    }  # fmt: skip
    opts = [f"{k}={v}" for k, v in opts.items()]
    config = load_config("opd_arithmetic", ["--", *opts])
    summary = opd.run(config, "opd_arithmetic", opts, default_out_dir(config))
    rows = [
        json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in rows if "train/opd/reverse_kl" in r]
    assert len(steps) == 2 and all(r["train/env/env_tokens_mean"] > 0 for r in steps)


def test_a_tokenizer_without_a_usable_template_is_refused_when_the_reward_role_starts(
    tmp_path,
) -> None:
    from posttrain.env import TemplateError
    from posttrain.model.tiny import build_tiny_model

    plain = build_tiny_model("tiny", tmp_path / "plain", seed=0)  # char tokenizer, no template
    with pytest.raises(TemplateError) as e:
        RewardRole(_config(plain, name="calculator", max_context=200))
    assert "no chat template" in str(e.value) and "\n" not in str(e.value)


def test_samples_hold_whole_trajectories(tmp_path, model_dir) -> None:
    """Issue 33 item 9: a multi-turn run's samples/ held only the last turn."""
    _run(tmp_path, model_dir, "mt-samples", **{"rl.max_steps": 1, "rl.eval_every": 1})
    run = tmp_path / "out" / "grpo" / "mt-samples"
    tok = build_tools_tokenizer()
    for path in (
        run / "samples" / "train" / "step_000001.jsonl",
        run / "samples" / "step_000001.jsonl",
    ):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert rows
        for row in rows:
            t = row["trajectory"]
            segs = t["segments"]
            assert [next(iter(s)) for s in segs][::2] == ["policy"] * len(segs[::2])  # alternate
            assert sum(s["tokens"] for s in segs) == t["policy_tokens"] + t["env_tokens"]
            assert t["policy_tokens"] == sum(s["tokens"] for s in segs if "policy" in s)
            assert t["turns"] == len([s for s in segs if "policy" in s])
            assert row["prompt"] in t["opening"]
            assert t["info"]["nudges"] <= t["turns"]  # the environment's declared count
            env = [s["environment"] for s in segs if "environment" in s]
            assert all("U:more" in e for e in env)  # the environment's turns, as rendered
            # the last policy turn, without its special tokens, is the completion scored
            last = tok.decode(
                tok(segs[-1 if "policy" in segs[-1] else -2]["policy"], add_special_tokens=False)[
                    "input_ids"
                ],
                skip_special_tokens=True,
            )
            assert last == row["completion"]
        assert any(r["trajectory"]["turns"] > 1 for r in rows)


def test_single_turn_samples_are_unchanged(tmp_path) -> None:
    from posttrain.config import load_config
    from posttrain.config.build import build_objective
    from posttrain.entrypoints import grpo

    opts = [f"job.output_root={tmp_path}", "data.train_size=8", "data.val_size=2",
            "data.prompts_per_step=2", "rollout.n=2", "rl.max_steps=1", "rl.eval_every=1",
            "logging.progress=false", "model.init_preset=tiny",
            f"model.name_or_path={tmp_path / 'tiny'}"]  # fmt: skip
    config = load_config("arithmetic", ["--", *opts])
    summary = grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config), build_objective)
    for path in sorted((Path(summary["run_dir"]) / "samples").rglob("*.jsonl")):
        for line in path.read_text().splitlines():
            assert set(json.loads(line)) <= {"prompt", "answer", "completion", "reward",
                                             "correct", "advantage"}  # fmt: skip
