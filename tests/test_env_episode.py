"""The multi-turn driver: batched turns, bounds and truncations, KV-cache-style continuation."""

from __future__ import annotations

import pytest

from posttrain.env import (
    EnvironmentFailedError,
    EnvStep,
    EpisodeLimits,
    TurnRequest,
    episode_metrics,
    run_episodes,
)
from posttrain.env.chat_template import build_tools_tokenizer
from posttrain.env.render import decode, encode, render
from posttrain.env.tools import CALCULATOR, calculator_environment

TOOLS = [CALCULATOR.schema]


def call(expression: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


class Scripted:
    """A fake engine: per trajectory a list of turn texts, sampled one id per character.

    It checks the KV-cache contract: ``context`` is exactly what it saw before (its own cache)
    plus ``new_ids``, so an engine that keeps a cache needs only ``new_ids``.
    """

    def __init__(self, tok, scripts: dict[int, list[str]]) -> None:
        self.tok, self.scripts = tok, scripts
        self.cache: dict[int, list[int]] = {}
        self.batches: list[list[int]] = []
        self.released: list[list[int]] = []
        self.sampled: dict[int, list[list[int]]] = {k: [] for k in scripts}

    def __call__(self, requests: list[TurnRequest]) -> list[list[int]]:
        self.batches.append([r.key for r in requests])
        outs = []
        for r in requests:
            assert r.context == self.cache.get(r.key, []) + r.new_ids
            text = self.scripts[r.key].pop(0)
            ids = [self.tok.convert_tokens_to_ids(c) for c in text] + [self.tok.eos_token_id]
            ids = ids[: r.max_new_tokens]
            self.cache[r.key] = r.context + ids
            self.sampled[r.key].append(ids)
            outs.append(ids)
        return outs

    def release(self, keys: list[int]) -> None:
        self.released.append(list(keys))


@pytest.fixture(scope="module")
def tok():
    return build_tools_tokenizer()


ITEMS = [{"prompt": "1+1?"}, {"prompt": "12+7?"}, {"prompt": "loop"}]
SCRIPTS = {
    0: ["2"],  # answers at once: one turn
    1: [call("12+7"), "19"],  # one tool call, then the answer: two turns
    2: [call("1"), call("2"), call("3"), call("4")],  # keeps calling: cut at max_turns
}


LIMITS = EpisodeLimits(3, 200, 2000)


def run(tok, scripts, limits=LIMITS, items=ITEMS, make_env=None):
    gen = Scripted(tok, {k: list(v) for k, v in scripts.items()})
    eps = run_episodes(items, make_env or calculator_environment, tok, gen, limits)
    return eps, gen


def test_trajectories_finish_at_different_turns(tok) -> None:
    eps, gen = run(tok, SCRIPTS)
    assert [e.turns for e in eps] == [1, 2, 3]
    assert [(e.done, e.truncated) for e in eps] == [
        (True, None),
        (True, None),
        (False, "max_turns"),
    ]
    assert gen.batches == [[0, 1, 2], [1, 2], [2]]  # finished trajectories leave the batch
    assert gen.released == [[0], [1], [2]]
    assert eps[1].messages[-2] == {"role": "tool", "name": "calculator", "content": "19"}
    assert eps[1].messages[-1] == {"role": "assistant", "content": "19"}
    assert eps[1].info == {
        "tool_calls": 1, "tool_errors": 0, "tool_timeouts": 0, "turns": 2,
        "policy_tokens": eps[1].info["policy_tokens"], "env_tokens": eps[1].info["env_tokens"],
        "dropped_observations": 0,
    }  # fmt: skip
    assert eps[2].info["tool_calls"] == 3
    assert all(e.reward is None for e in eps)  # the calculator leaves scoring to the reward stage


def test_mask_is_exactly_the_sampled_ids(tok) -> None:
    eps, gen = run(tok, SCRIPTS)
    for key, ep in enumerate(eps):
        assert len(ep.ids) == len(ep.mask)
        policy = [i for i, m in zip(ep.ids, ep.mask, strict=True) if m]
        assert policy == [i for turn in gen.sampled[key] for i in turn]
        assert ep.info["policy_tokens"] == len(policy)
        assert ep.info["env_tokens"] == len(ep.ids) - len(policy)
        assert ep.mask[: ep.prompt_len] == [0] * ep.prompt_len
        assert ep.ids == gen.cache[key]  # the engine's view is the trajectory, id for id
    # the history kept the sampled character ids: re-encoding its text would merge the markers
    assert encode(tok, decode(tok, eps[1].ids)) != eps[1].ids


def test_ids_render_the_conversation(tok) -> None:
    eps, _ = run(tok, SCRIPTS)
    text = render(tok, eps[1].messages, TOOLS)
    assert decode(tok, eps[1].ids) + "\n" == text  # all but the closer after the last stop


def test_turn_token_limit_truncates(tok) -> None:
    eps, gen = run(tok, {0: ["a" * 50]}, EpisodeLimits(3, 10, 2000), items=ITEMS[:1])
    assert (eps[0].turns, eps[0].truncated, eps[0].done) == (1, "turn_tokens", False)
    assert sum(eps[0].mask) == 10
    assert eps[0].messages[-1] == {"role": "assistant", "content": "a" * 10}


def test_context_limit_shrinks_the_turn_and_drops_the_observation(tok) -> None:
    prompt_len = len(run(tok, {0: ["2"]}, items=ITEMS[:1])[0][0].ids) - 2
    # room for the first call, not for the calculator's answer after it
    limits = EpisodeLimits(5, 500, prompt_len + len(call("12+7")) + 5)
    eps, gen = run(tok, {0: [call("12+7"), "19"]}, limits, items=ITEMS[:1])
    assert (eps[0].turns, eps[0].truncated) == (1, "context")
    assert len(eps[0].ids) < limits.max_context
    assert eps[0].messages[-1]["role"] == "assistant"  # the answer was not appended
    assert eps[0].info["dropped_observations"] == 1  # counted (issue 33 item 5)
    # a budget smaller than the turn limit, used up: truncated by the context
    limits = EpisodeLimits(5, 500, prompt_len + 10)
    eps, _ = run(tok, {0: [call("12+7")]}, limits, items=ITEMS[:1])
    assert (eps[0].truncated, len(eps[0].ids)) == ("context", limits.max_context)
    assert eps[0].info["dropped_observations"] == 0  # the turn was cut, nothing dropped


def test_prompt_longer_than_the_context_is_truncated_without_a_turn(tok) -> None:
    eps, gen = run(tok, {0: []}, EpisodeLimits(3, 10, 5), items=ITEMS[:1])
    assert (eps[0].turns, eps[0].truncated, gen.batches) == (0, "context", [])


def test_metrics(tok) -> None:
    eps, _ = run(tok, SCRIPTS)
    m = episode_metrics(eps)
    assert m["episodes"] == 3 and m["turns_mean"] == 2.0
    assert (m["tool_calls"], m["tool_errors"], m["truncated_max_turns"]) == (4, 0, 1)
    assert m["policy_tokens"] == sum(sum(e.mask) for e in eps)
    assert m["env_tokens"] == sum(len(e.mask) - sum(e.mask) for e in eps)


class Judge:
    """A user environment: asks once for a retry, then rewards the answer '19'."""

    info_keys = ("asks",)

    def reset(self, item):
        return [{"role": "user", "content": item["prompt"]}]

    def step(self, messages):
        if len(messages) < 4:
            return EnvStep([{"role": "user", "content": "sure?"}], reward=0.5, info={"asks": 1})
        return EnvStep(done=True, reward=float(messages[-1]["content"] == "19"))


class Broken(Judge):
    def step(self, messages):
        raise KeyError("state")


class Meddler(Judge):
    def step(self, messages):
        messages.clear()  # edits the list it was given
        return EnvStep(done=True)


def failing_factory():
    raise RuntimeError("no data")


def test_user_environment_rewards_are_summed(tok) -> None:
    eps, _ = run(tok, {0: ["18", "19"], 1: ["19", "7"]}, items=ITEMS[:2], make_env=Judge)
    assert [e.reward for e in eps] == [1.5, 0.5]
    assert eps[0].info["asks"] == 1
    assert eps[0].messages[2] == {"role": "user", "content": "sure?"}


def test_environment_failure_names_item_and_turn(tok) -> None:
    with pytest.raises(EnvironmentFailedError) as e:
        run(tok, {0: ["1"]}, items=ITEMS[:1], make_env=Broken)
    assert str(e.value) == "environment on item 0 turn 1: KeyError: 'state'"
    with pytest.raises(EnvironmentFailedError) as e:
        run(tok, {0: ["1"]}, items=ITEMS[:1], make_env=failing_factory)
    assert str(e.value) == "environment on item 0 factory: RuntimeError: no data"


def test_environment_cannot_rewrite_the_conversation(tok) -> None:
    eps, _ = run(tok, {0: ["7"]}, items=ITEMS[:1], make_env=Meddler)
    assert eps[0].messages == [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "7"},
    ]


def test_engine_breaking_the_contract_is_caught(tok) -> None:
    def short(requests):
        return [[5] for _ in requests]  # no stop id, under budget

    with pytest.raises(ValueError, match="must end at a stop id"):
        run_episodes(ITEMS[:1], calculator_environment, tok, short, EpisodeLimits(2, 8, 500))


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_turns must be >= 1"):
        EpisodeLimits(0, 1, 1)


def test_fallback_mode_runs_without_template_tools(tok) -> None:
    import functools

    from posttrain.env.render import check_template

    check_template(tok)  # the template is also prefix-stable with no tools
    make = functools.partial(calculator_environment, native_tools=False)
    eps, _ = run(tok, {0: [call("12+7"), "19"]}, items=ITEMS[1:2], make_env=make)
    ep = eps[0]
    assert ep.messages[0]["role"] == "system" and "<tool_call>" in ep.messages[0]["content"]
    assert ep.messages[3] == {"role": "user", "content": "<tool_response>19</tool_response>"}
    assert decode(tok, ep.ids) + "\n" == render(tok, ep.messages)
    assert (ep.turns, ep.done, ep.info["tool_calls"]) == (2, True, 1)


class Counter(Judge):
    """Declares two keys and reports ``hits`` only on an answer of '19'."""

    info_keys = ("asks", "hits")

    def step(self, messages):
        if messages[-1]["content"] == "19":
            return EnvStep(done=True, info={"hits": 0.5})
        return super().step(messages)


def test_a_declared_info_key_no_step_reported_is_zero(tok) -> None:
    eps, _ = run(tok, {0: ["18", "19"], 1: ["19"]}, items=ITEMS[:2], make_env=Counter)
    assert [(e.info["asks"], e.info["hits"]) for e in eps] == [(1, 0.5), (0, 0.5)]
    eps, _ = run(tok, {0: ["18", "7"]}, items=ITEMS[:1], make_env=Counter)
    assert (eps[0].info["asks"], eps[0].info["hits"]) == (1, 0)  # declared, never reported


class Undeclared(Judge):
    info_keys = ()


def test_an_undeclared_info_key_fails_in_one_line(tok) -> None:
    with pytest.raises(EnvironmentFailedError) as e:
        run(tok, {0: ["1"]}, items=ITEMS[:1], make_env=Undeclared)
    assert str(e.value) == (
        "environment on item 0 turn 1: info key 'asks' is not declared (info_keys: none); add "
        "it to the environment's info_keys to publish it as env/asks_mean"
    )

    class Extra(type(calculator_environment())):
        def step(self, messages):
            return EnvStep(done=True, info={"call_right": 1})

    with pytest.raises(EnvironmentFailedError) as e:
        run(tok, {0: ["1"]}, items=ITEMS[:1], make_env=lambda: Extra([CALCULATOR]))
    assert str(e.value) == (
        "environment on item 0 turn 1: info key 'call_right' is not declared (info_keys: "
        "'tool_calls', 'tool_errors', 'tool_timeouts'); add it to the environment's info_keys "
        "to publish it as env/call_right_mean"
    )


@pytest.mark.parametrize("bad", ["1", None, True, float("nan"), float("inf")])
def test_a_non_numeric_or_non_finite_info_value_fails_in_one_line(tok, bad) -> None:
    class Bad(Judge):
        def step(self, messages):
            return EnvStep(done=True, info={"asks": bad})

    with pytest.raises(EnvironmentFailedError) as e:
        run(tok, {0: ["1"]}, items=ITEMS[:1], make_env=Bad)
    assert str(e.value) == (
        f"environment on item 0 turn 1: info['asks'] = {bad!r} is not a finite number; report "
        "an int or a float (int(flag) for a yes/no)"
    )


def test_numpy_numbers_are_info_values(tok) -> None:
    import numpy as np

    class Numpy(Judge):
        def step(self, messages):
            return EnvStep(done=True, info={"asks": np.int64(2)})

    eps, _ = run(tok, {0: ["1"]}, items=ITEMS[:1], make_env=Numpy)
    assert eps[0].info["asks"] == 2


@pytest.mark.parametrize(
    ("keys", "line"),
    [
        ("asks", "info_keys = 'asks' is not a list of names; declare info_keys = ('my_count', ...)"),
        (("asks", "a b"), "info key 'a b' is not a name; use letters, digits and '_', starting "
                          "with a letter"),
        (("reward",), "info key 'reward' is reserved (the driver's own dropped_observations, env_tokens, "
                      "policy_tokens, reward, truncation, turns); rename it"),
        (("asks", "asks"), "info_keys lists ['asks'] twice; list each once"),
    ],
)  # fmt: skip
def test_bad_info_key_declarations_fail_in_one_line(keys, line) -> None:
    from posttrain.env import EnvironmentSpecError
    from posttrain.env.base import environment_info_keys

    env = Judge()
    env.info_keys = keys
    with pytest.raises(EnvironmentSpecError) as e:
        environment_info_keys(env, "environment 'my_env:make'")
    assert str(e.value) == f"environment 'my_env:make': {line}"


def test_preflight_refuses_a_reserved_info_key() -> None:
    from posttrain.env import EnvironmentSpecError, check_environment

    check_environment("role_fixtures:chatty")
    with pytest.raises(EnvironmentSpecError) as e:
        check_environment("role_fixtures:reserved_info")
    assert str(e.value) == (
        "environment 'role_fixtures:reserved_info': info key 'turns' is reserved (the "
        "driver's own dropped_observations, env_tokens, policy_tokens, reward, truncation, turns); rename it"
    )
