"""Multi-turn episodes over any engine: sample a turn, let the environment answer, repeat.

The driver is engine-agnostic: ``generate(requests)`` samples one turn for a batch of
trajectories. Each :class:`TurnRequest` carries the ids appended to its trajectory since the
engine last saw it (the prompt on the first call, then one observation segment), so an engine
that keeps a KV cache per trajectory prefills only those; ``context`` holds all ids for an
engine without one. Trajectories that finish (at different turns) leave the batch; an engine
with a ``release(keys)`` method is told, so it can free their caches.

Bounds, each marking the episode ``truncated`` with its reason: ``max_turns`` policy turns
(``"max_turns"``), ``max_turn_tokens`` per turn (``"turn_tokens"``, a turn cut before its stop
token ends the episode: its text may hold half a tool call), and ``max_context`` ids in all
(``"context"``: the turn budget shrinks to what is left, and an observation that would leave no
room is not appended: it is counted as ``dropped_observations``, and the training host warns
once a run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from posttrain.env.base import (
    Environment,
    EnvironmentFailedError,
    EnvStep,
    Message,
    check_messages,
    check_step,
    environment_info_keys,
    environment_tools,
)
from posttrain.env.render import TokenTrajectory, decode, encode, observation_segment, render


@dataclass(frozen=True)
class TurnRequest:
    """One trajectory's next turn: ``key`` names it across calls for the engine's cache."""

    key: int
    new_ids: list[int]
    context: list[int]
    max_new_tokens: int


class TurnGenerator(Protocol):
    """Samples one turn per request: ids up to and including a stop id, or ``max_new_tokens``."""

    def __call__(self, requests: Sequence[TurnRequest]) -> Sequence[Sequence[int]]: ...


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int
    max_turn_tokens: int
    max_context: int

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_turn_tokens", "max_context"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


#: The entry of :attr:`Episode.info` that is 1 when an observation was dropped because it did
#: not fit ``max_context`` (published as ``env/dropped_observations_mean``).
DROPPED = "dropped_observations"

#: Entries of :attr:`Episode.info` that count the trajectory's tokens (the policy mask holds
#: them too, so a batch derives them from the mask rather than carrying them twice).
TOKEN_COUNTS = ("policy_tokens", "env_tokens")


@dataclass
class Episode:
    """A finished trajectory: ids, policy mask (1 = sampled), and what the environment said.

    ``reward`` sums the environment's step rewards (``None`` if it gave none); ``info`` sums
    its step infos, one entry per declared info key (0 where no step reported it), and adds
    ``turns``, the :data:`TOKEN_COUNTS` and :data:`DROPPED`. ``turn_rewards`` holds the
    reward of each policy turn, in order (0.0 for a turn whose step gave none or that was cut
    before its step), for per-turn credit (``rl.credit=turn``).
    """

    ids: list[int]
    mask: list[int]
    prompt_len: int
    turns: int
    reward: float | None
    info: dict[str, float]
    messages: list[Message]
    truncated: str | None
    done: bool
    turn_rewards: list[float] = field(default_factory=list)


@dataclass
class _State:
    env: Environment
    messages: list[Message]
    traj: TokenTrajectory
    prompt_text: str
    pending: list[int]
    tools: list[dict[str, Any]]
    prompt_len: int
    turns: int = 0
    rewards: list[float] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    info: dict[str, float] = field(default_factory=dict)
    truncated: str | None = None
    done: bool = False
    finished: bool = False
    #: Why the environment's last observation was dropped (it did not fit the context).
    dropped: str | None = None

    def finish(self, truncated: str | None = None, done: bool = False) -> None:
        self.truncated, self.done, self.finished = truncated, done, True

    def episode(self) -> Episode:
        info = dict(self.info)
        info |= {"turns": self.turns, "policy_tokens": self.traj.policy_tokens}
        info["env_tokens"] = self.traj.env_tokens
        info[DROPPED] = int(self.dropped is not None)
        return Episode(
            ids=self.traj.ids,
            mask=self.traj.mask,
            prompt_len=self.prompt_len,
            turns=self.turns,
            reward=sum(self.rewards) if self.rewards else None,
            info=info,
            messages=self.messages,
            truncated=self.truncated,
            done=self.done,
            turn_rewards=list(self.turn_rewards),
        )


def _call_env(fn: Callable[[], Any], where: str) -> Any:
    try:
        return fn()
    except EnvironmentFailedError:
        raise
    except Exception as e:  # the user's environment failed: name the item and turn
        raise EnvironmentFailedError(f"{where}: {type(e).__name__}: {e}") from e


def _open(
    env: Environment, item: dict[str, Any], tokenizer: Any, info_keys: Sequence[str], where: str
) -> _State:
    messages = check_messages(_call_env(lambda: env.reset(item), f"{where} reset"), where)
    tools = environment_tools(env)
    prompt_text = render(tokenizer, messages, tools, generation_prompt=True)
    ids = encode(tokenizer, prompt_text)
    traj = TokenTrajectory()
    traj.add(ids, policy=False)
    state = _State(env, list(messages), traj, prompt_text, ids, tools, prompt_len=len(ids))
    state.info = dict.fromkeys(info_keys, 0)  # every declared key, reported or not
    return state


def _take_turn(
    s: _State, out: Sequence[int], budget: int, by_context: bool, tokenizer: Any,
    stop_ids: frozenset[int], limits: EpisodeLimits, where: str,
) -> None:  # fmt: skip
    """Append a sampled turn, step the environment, append its observation or finish."""
    out = [int(i) for i in out]
    stopped = bool(out) and out[-1] in stop_ids
    if len(out) > budget or (not stopped and len(out) < budget):
        raise ValueError(
            f"{where}: generate returned {len(out)} ids for a turn of at most {budget} that "
            "must end at a stop id unless it uses the whole budget"
        )
    s.traj.add(out, policy=True)
    s.turns += 1
    s.turn_rewards.append(0.0)
    content = decode(tokenizer, out[:-1] if stopped else out)
    s.messages.append({"role": "assistant", "content": content})
    if not stopped:
        s.finish("context" if by_context else "turn_tokens")
        return
    turn_where = f"{where} turn {s.turns}"
    # a copy: an environment that edits the list it is given cannot rewrite the trajectory
    answer = _call_env(lambda: s.env.step(list(s.messages)), turn_where)
    step: EnvStep = check_step(answer, turn_where, s.info.keys())
    for key, value in step.info.items():
        s.info[key] = s.info.get(key, 0) + value
    if step.reward is not None:
        s.rewards.append(float(step.reward))
        s.turn_rewards[-1] = float(step.reward)
    if step.done:
        s.finish(done=True)
        return
    if s.turns >= limits.max_turns:
        s.finish("max_turns")
        return
    seg = observation_segment(
        tokenizer, s.messages, step.messages, prompt_text=s.prompt_text,
        stop_text=decode(tokenizer, out[-1:]), tools=s.tools,
    )  # fmt: skip
    if len(s.traj.ids) + len(seg.ids) >= limits.max_context:
        s.dropped = (
            f"{where} turn {s.turns}: the environment's observation of {len(seg.ids)} tokens "
            f"did not fit max_context={limits.max_context} after the trajectory's "
            f"{len(s.traj.ids)}, so it was dropped and the episode ended (truncated by the "
            "context)"
        )
        s.finish("context")
        return
    s.traj.add(seg.ids, policy=False)
    s.messages.extend(step.messages)
    s.prompt_text, s.pending = seg.prompt_text, seg.ids


class EpisodeBatch:
    """The episodes of one rollout, advanced one batched turn at a time (the environment's side).

    Split from the engine so that each side can live in its own process: :meth:`requests` gives
    the live trajectories' next turns, :meth:`advance` takes the sampled ids and lets each
    environment answer. ``stop_ids`` default to the tokenizer's EOS id; the template must close
    an assistant turn with the stop token's text (:func:`posttrain.env.render.check_template`).
    ``info_keys``: the keys a step may report (the training host reads them once per run); by
    default the first environment's declared ``info_keys``.
    """

    def __init__(
        self,
        items: Sequence[dict[str, Any]],
        make_env: Callable[[], Environment],
        tokenizer: Any,
        limits: EpisodeLimits,
        stop_ids: Sequence[int] | None = None,
        name: str = "environment",
        info_keys: Sequence[str] | None = None,
    ) -> None:
        self.tokenizer, self.limits, self.name = tokenizer, limits, name
        self.stops = frozenset(stop_ids if stop_ids is not None else [tokenizer.eos_token_id])
        self.states: list[_State] = []
        for i, item in enumerate(items):
            where = f"{name} on item {i}"
            env = _call_env(make_env, f"{where} factory")
            if info_keys is None:
                info_keys = environment_info_keys(env, name)
            self.states.append(_open(env, item, tokenizer, info_keys, where))
        for s in self.states:
            if len(s.traj.ids) >= limits.max_context:
                s.finish("context")
        self._budgets: dict[int, int] = {}

    def requests(self) -> list[TurnRequest]:
        """The next turn of every live trajectory (empty once all have finished)."""
        lim, out = self.limits, []
        self._budgets = {}
        for i, s in enumerate(self.states):
            if s.finished:
                continue
            budget = min(lim.max_turn_tokens, lim.max_context - len(s.traj.ids))
            self._budgets[i] = budget
            out.append(TurnRequest(i, list(s.pending), list(s.traj.ids), budget))
        return out

    def advance(self, outs: Sequence[Sequence[int]]) -> list[int]:
        """Append the turns sampled for the last :meth:`requests`; the keys that finished."""
        live = list(self._budgets)
        if len(outs) != len(live):
            raise ValueError(f"generate answered {len(outs)} turns for {len(live)} requests")
        for i, out in zip(live, outs, strict=True):
            budget = self._budgets[i]
            _take_turn(
                self.states[i], out, budget, budget < self.limits.max_turn_tokens,
                self.tokenizer, self.stops, self.limits, f"{self.name} on item {i}",
            )  # fmt: skip
        self._budgets = {}
        return [i for i in live if self.states[i].finished]

    def episodes(self) -> list[Episode]:
        return [s.episode() for s in self.states]

    def dropped(self) -> list[str]:
        """Why each dropped observation was dropped (one line each), in trajectory order."""
        return [s.dropped for s in self.states if s.dropped is not None]


def run_episodes(
    items: Sequence[dict[str, Any]],
    make_env: Callable[[], Environment],
    tokenizer: Any,
    generate: TurnGenerator,
    limits: EpisodeLimits,
    stop_ids: Sequence[int] | None = None,
    name: str = "environment",
) -> list[Episode]:
    """Run one episode per item in this process, every live trajectory's turn in one
    ``generate`` call (:class:`EpisodeBatch`); an engine with ``release(keys)`` is told which
    trajectories ended."""
    batch = EpisodeBatch(items, make_env, tokenizer, limits, stop_ids, name)
    release = getattr(generate, "release", None)
    while requests := batch.requests():
        ended = batch.advance(generate(requests))
        if release is not None and ended:
            release(ended)
    return batch.episodes()


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Batch metrics: mean turns, summed tool counts and tokens, truncations by reason."""
    n = max(len(episodes), 1)
    out: dict[str, float] = {"episodes": len(episodes)}
    out["turns_mean"] = sum(e.turns for e in episodes) / n
    for e in episodes:
        for key, value in e.info.items():
            if key != "turns":
                out[key] = out.get(key, 0) + value
    for reason in ("max_turns", "turn_tokens", "context"):
        out[f"truncated_{reason}"] = sum(e.truncated == reason for e in episodes)
    return out
