"""Multi-turn rollouts: the driver between the reward role (environments) and the engine.

Each turn is one call to each side: the reward role answers the sampled turns and names the
next ones (:class:`posttrain.env.host.EpisodeHost`), the rollout role samples them, continuing
every trajectory from its KV cache (:mod:`posttrain.rollout.continuation`). The ids the policy
sampled are kept exactly; the environment's are rendered per segment (:mod:`posttrain.env.render`).

The episodes become the usual :class:`~posttrain.rollout.base.Rollout`: the prompt region holds
the opening prompt, the response region everything after it (policy turns *and* observations,
all attended), and ``response_mask`` marks the policy's tokens only. That mask is the one path
by which the loss, entropy, KL, TOKEN_SUM's weight and the logprob metrics skip environment
tokens; ``rollout_logprobs`` is 0 on them. Per-row counts travel as batch columns so they stay
aligned through dynamic sampling and reach the reward metrics: ``env_turns`` and one
``env_<key>`` per info key the environment declares (:func:`info_column`; the reward role reads
the declaration once per run, so every batch of a run has the same columns and rounds join).
The environment's reward travels the same way (``env_reward``) to the reward stage's score,
and, per token, which policy turn each token belongs to (``env_turn``: 1, 2, ...; 0 on the
environment's tokens) and that turn's reward (``env_turn_reward``), for ``rl.credit=turn``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posttrain.data.tasks import TaskItem
from posttrain.data.trajectory import TrajectoryBatch
from posttrain.env.episode import TOKEN_COUNTS, Episode
from posttrain.reward.stage import ENV_REWARD_COLUMN, TURN_COLUMN, TURN_REWARD_COLUMN
from posttrain.rollout.base import Rollout

#: Truncation reasons, coded in the ``env_truncation`` column (0: not truncated).
TRUNCATIONS = ("max_turns", "turn_tokens", "context")
TRUNCATION_COLUMN = "env_truncation"
#: What every multi-turn column's name starts with.
PREFIX = "env_"
#: The ``env_*`` columns that are not per-trajectory info counts (never published as a mean).
NOT_INFO = (ENV_REWARD_COLUMN, TRUNCATION_COLUMN, TURN_COLUMN, TURN_REWARD_COLUMN)


def info_column(key: str) -> str:
    """The batch column of an episode info key (``turns`` or a declared key): ``env_<key>``.

    Reserved keys (:data:`posttrain.env.base.RESERVED_INFO_KEYS`) keep these names apart from
    :data:`NOT_INFO` and from the token counts :func:`env_metrics` derives from the masks.
    """
    return f"{PREFIX}{key}"


def multiturn_rollout(
    roles, items: Sequence[TaskItem], tokenizer, *, n: int, temperature: float, top_p: float,
    seed: int, group_id_offset: int = 0, sample_id_offset: int = 0,
) -> Rollout:  # fmt: skip
    """``n`` episodes per item: environments in the reward role, turns in the rollout role."""
    rows = [it for it in items for _ in range(n)]
    requests = roles.reward.open_episodes(rows)
    logprobs: dict[int, list[float]] = {}
    sample = dict(temperature=temperature, top_p=top_p if temperature > 0 else 1.0, seed=seed)
    try:
        while requests:
            outs = roles.rollout.generate_turns(requests, **sample)
            for r, (_, lps) in zip(requests, outs, strict=True):
                logprobs.setdefault(r.key, []).extend(lps)
            requests = roles.reward.advance_episodes([ids for ids, _ in outs])
    finally:
        roles.rollout.end_turns()  # frees the engine's caches
    episodes = roles.reward.close_episodes()
    gid = torch.arange(len(items), dtype=torch.int64) + group_id_offset
    return episodes_rollout(episodes, logprobs, tokenizer, n, gid, sample_id_offset)


def _last_turn(ep: Episode) -> list[int]:
    """The ids of the policy's last turn (the final answer the verifiers read)."""
    end = max((i + 1 for i, m in enumerate(ep.mask) if m), default=0)
    start = end
    while start > 0 and ep.mask[start - 1]:
        start -= 1
    return ep.ids[start:end]


def _turn_columns(ep: Episode, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each response token's policy turn (1-based; 0 off the policy) and that turn's reward."""
    m = torch.tensor(ep.mask[ep.prompt_len :], dtype=torch.bool)
    prev = torch.zeros_like(m)
    prev[1:] = m[:-1]
    of = torch.cumsum(m & ~prev, 0) * m  # a run of policy tokens is one turn
    k = int(of.max()) if of.numel() else 0
    if ep.turn_rewards and k != len(ep.turn_rewards):  # the driver's episodes always match
        raise ValueError(
            f"episode has {len(ep.turn_rewards)} turn rewards but {k} runs of policy tokens"
        )
    per_turn = torch.tensor([0.0, *(ep.turn_rewards or [0.0] * k)], dtype=torch.float64)
    turn = torch.zeros(width, dtype=torch.float64)
    reward = torch.zeros(width, dtype=torch.float64)
    turn[: len(of)] = of.to(torch.float64)
    reward[: len(of)] = per_turn[of]
    return turn, reward


def episodes_rollout(
    episodes: Sequence[Episode],
    logprobs: dict[int, list[float]],
    tokenizer,
    n: int,
    group_ids: torch.Tensor,
    sample_id_offset: int = 0,
) -> Rollout:
    """The trajectory layout of ``episodes`` (row ``i`` is episode ``i``; ``n`` per group)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    b = len(episodes)
    p = max(e.prompt_len for e in episodes)
    r = max(1, max(len(e.ids) - e.prompt_len for e in episodes))
    ids = torch.full((b, p + r), int(pad), dtype=torch.long)
    attention = torch.zeros((b, p + r), dtype=torch.long)
    policy = torch.zeros((b, r), dtype=torch.bool)
    lp = torch.zeros((b, r), dtype=torch.float32)
    turn = torch.zeros((b, r), dtype=torch.float64)
    turn_reward = torch.zeros((b, r), dtype=torch.float64)
    for i, e in enumerate(episodes):
        prompt, resp = e.ids[: e.prompt_len], e.ids[e.prompt_len :]
        ids[i, p - len(prompt) : p] = torch.as_tensor(prompt, dtype=torch.long)
        attention[i, p - len(prompt) : p + len(resp)] = 1
        if resp:
            ids[i, p : p + len(resp)] = torch.as_tensor(resp, dtype=torch.long)
            policy[i, : len(resp)] = torch.as_tensor(e.mask[e.prompt_len :], dtype=torch.bool)
        sampled = logprobs.get(i, [])
        if len(sampled) != int(policy[i].sum()):
            raise ValueError(
                f"episode {i}: {len(sampled)} sampler logprobs for {int(policy[i].sum())} "
                "policy tokens"
            )
        lp[i, policy[i]] = torch.as_tensor(sampled, dtype=torch.float32)
        turn[i], turn_reward[i] = _turn_columns(e, r)
    # the declared keys (the same in every episode of a run), in first-seen order
    keys = dict.fromkeys(k for e in episodes for k in e.info if k not in TOKEN_COUNTS)
    keys.pop("turns", None)
    turns = torch.as_tensor([float(e.turns) for e in episodes], dtype=torch.float64)
    columns = {info_column("turns"): turns}
    for key in keys:  # 0 where an episode has no value (a hand-built one)
        values = [float(e.info.get(key, 0)) for e in episodes]
        columns[info_column(key)] = torch.as_tensor(values, dtype=torch.float64)
    # the environment's reward, a term of the row's score (0 where it gave none)
    columns[ENV_REWARD_COLUMN] = torch.as_tensor(
        [0.0 if e.reward is None else float(e.reward) for e in episodes], dtype=torch.float64
    )
    columns[TURN_COLUMN], columns[TURN_REWARD_COLUMN] = turn, turn_reward
    columns[TRUNCATION_COLUMN] = torch.as_tensor(
        [0.0 if e.truncated is None else 1.0 + TRUNCATIONS.index(e.truncated) for e in episodes]
    )
    batch = TrajectoryBatch(
        input_ids=ids, attention_mask=attention, response_mask=policy,
        group_ids=group_ids.repeat_interleave(n),
        sample_ids=torch.arange(b, dtype=torch.int64) + sample_id_offset,
        rollout_logprobs=lp, columns=columns,
    )  # fmt: skip
    texts = tuple(tokenizer.decode(_last_turn(e), skip_special_tokens=True) for e in episodes)
    truncated = torch.as_tensor([e.truncated is not None for e in episodes], dtype=torch.bool)
    return Rollout(batch=batch, truncated=truncated, texts=texts, n=n)


def env_metrics(batch: TrajectoryBatch) -> dict[str, float]:
    """Turns and every declared info key (``env/<key>_mean``, per trajectory), truncations by
    reason (fractions), policy vs environment tokens (means per trajectory) of a multi-turn
    batch; ``{}`` otherwise."""
    c = batch.columns
    if TRUNCATION_COLUMN not in c:
        return {}
    policy = batch.response_mask.sum(-1).double()
    env = batch.attention_mask[:, batch.prompt_width :].sum(-1).double() - policy
    out = {
        f"env/{col.removeprefix(PREFIX)}_mean": float(c[col].double().mean())
        for col in c
        if col.startswith(PREFIX) and col not in NOT_INFO
    }
    for code, reason in enumerate(TRUNCATIONS, start=1):
        out[f"env/truncated_{reason}_frac"] = float((c[TRUNCATION_COLUMN] == code).double().mean())
    out["env/policy_tokens_mean"] = float(policy.mean())
    out["env/env_tokens_mean"] = float(env.mean())
    return out


def trajectory_records(batch: TrajectoryBatch, tokenizer, rows: int) -> list[dict] | None:
    """What each of the first ``rows`` multi-turn trajectories holds, for ``samples/``: the
    opening prompt as rendered, then every segment in order, the policy's turns (tool calls
    included) and the environment's observations (tool responses, user turns, the template's
    markers), each decoded as it stands in the ids with its token count, and the environment's
    declared info counts; ``None`` for a
    single-turn batch (its sample rows stay as they were)."""
    if TRUNCATION_COLUMN not in batch.columns:
        return None
    p = batch.prompt_width

    def text(ids) -> str:
        return tokenizer.decode(ids.tolist(), skip_special_tokens=False)

    out = []
    for i in range(min(rows, batch.batch_size)):
        attended = batch.attention_mask[i].bool()
        prompt = batch.input_ids[i, :p][attended[:p]]
        ids = batch.input_ids[i, p:][attended[p:]]
        policy = batch.response_mask[i, : len(ids)].tolist()
        segments, start = [], 0
        for end in range(1, len(ids) + 1):
            if end == len(ids) or policy[end] != policy[start]:
                who = "policy" if policy[start] else "environment"
                segments.append({who: text(ids[start:end]), "tokens": end - start})
                start = end
        truncation = int(batch.columns[TRUNCATION_COLUMN][i])
        out.append({
            "opening": text(prompt),
            "segments": segments,
            "turns": int(batch.columns[info_column("turns")][i]),
            "policy_tokens": sum(policy),
            "env_tokens": len(policy) - sum(policy),
            "truncated": TRUNCATIONS[truncation - 1] if truncation else None,
            "info": {  # the environment's declared counts (tool_calls, tool_errors, ...)
                col.removeprefix(PREFIX): float(batch.columns[col][i])
                for col in batch.columns
                if col.startswith(PREFIX) and col not in (*NOT_INFO, info_column("turns"))
            },
        })  # fmt: skip
    return out
