"""Multi-turn preflight with the tokenizer (issue 33 items 4 and 5): the chat template and the
opening prompt against env.max_context are refused in one line by `config show`, before any
model loads; an observation dropped for the context is warned once and counted."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
from cli_here import posttrain_here
from multiturn_fixtures import build_tools_model

from posttrain.config import PosttrainConfig
from posttrain.data.tasks import TaskItem
from posttrain.env.host import EpisodeHost
from posttrain.model.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]


def _show(tmp_path: Path, *opts: str) -> subprocess.CompletedProcess:
    return posttrain_here(
        ["config", "show", "--config", "tools_addition", "--",
         f"model.name_or_path={tmp_path / 'not_built'}", *opts],
        tmp_path,
    )  # fmt: skip


def _one_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2 and out.stdout == "", out.stderr
    assert "Traceback" not in out.stderr and out.stderr.strip().count("\n") == 0, out.stderr
    return out.stderr.strip()


def test_max_context_below_the_opening_prompt_is_refused_by_config_show(tmp_path) -> None:
    """Item 5: env.max_context=8 was accepted; every step then skipped its update."""
    line = _one_line(_show(tmp_path, "env.max_context=8"))
    assert line == (
        "posttrain: error: env.max_context=8 leaves no room for a turn: the environment's "
        "opening prompt is 15 tokens (row arithmetic/621+393=, with the tokenizer of "
        "model.init_preset=arith_tools); set env.max_context to at least 23 (the prompt and one "
        "turn of rollout.max_tokens=8)"
    )
    assert _show(tmp_path, "env.max_context=23").returncode == 0


def test_a_tokenizer_without_a_chat_template_is_refused_by_config_show(tmp_path) -> None:
    """Item 4: only the reward role's start caught it, and the line named no fix."""
    line = _one_line(_show(tmp_path, "model.init_preset=tiny", "env.name=calculator"))
    assert line == (
        "posttrain: error: env.name=calculator with the tokenizer of model.init_preset=tiny: "
        "the tokenizer has no chat template; multi-turn rollouts render every turn with one: "
        "set model.tokenizer_path to a tokenizer folder whose tokenizer_config.json has a "
        "prefix-stable chat_template (a tiny model from scratch: model.init_preset=tiny_tools, "
        "printable ASCII with tool markers and a template)"
    )


def test_a_saved_tokenizer_s_template_is_probed_without_the_model(tmp_path) -> None:
    from posttrain.model.tokenizer import build_char_tokenizer, save_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m.content | trim }}{% endfor %}"
    save_char_tokenizer(tok, tmp_path / "tok")
    line = _one_line(_show(tmp_path, f"model.tokenizer_path={tmp_path / 'tok'}"))
    assert line.startswith(
        "posttrain: error: env.name=posttrain.env.arithmetic:arithmetic_tool_environment with "
        f"the tokenizer of model.tokenizer_path='{tmp_path / 'tok'}': chat template (probe turn "
        "1) is not prefix-stable"
    )


def test_a_dropped_observation_is_warned_once_and_counted(tmp_path, caplog) -> None:
    """Item 5: an observation dropped for the context was dropped without a word."""
    model = build_tools_model(tmp_path / "model")
    cfg = PosttrainConfig(
        model={"name_or_path": str(model)}, rollout={"max_tokens": 6},
        env={"name": "role_fixtures:chatty", "max_turns": 5, "max_context": 16},
    )  # fmt: skip
    tok = load_tokenizer(model)
    host = EpisodeHost(cfg, tok)
    a = tok.convert_tokens_to_ids("a")
    with caplog.at_level(logging.WARNING, logger="posttrain"):
        for _ in range(2):  # two rollouts: the warning once, the count each time
            requests = host.open([TaskItem("1+1=", "2"), TaskItem("2+2=", "4")])
            while requests:
                requests = host.advance([[a, tok.eos_token_id] for _ in requests])
            episodes = host.close()
            assert [e.info["dropped_observations"] for e in episodes] == [1, 1]
            assert all(e.truncated == "context" for e in episodes)
    warnings = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(warnings) == 1
    assert (
        "environment 'role_fixtures:chatty' on item 0 turn 1: the environment's " in (warnings[0])
    )
    assert "did not fit max_context=16" in warnings[0]
    assert "raise env.max_context" in warnings[0]


def test_dropped_observations_become_a_metric() -> None:
    import torch

    from posttrain.env.chat_template import build_tools_tokenizer
    from posttrain.env.episode import Episode
    from posttrain.rollout.multiturn import env_metrics, episodes_rollout

    def episode(dropped: int) -> Episode:
        info = {"turns": 1, "policy_tokens": 1, "env_tokens": 2, "dropped_observations": dropped}
        return Episode([5, 6, 7], [0, 0, 1], 2, 1, None, info, [], "context", False)

    rollout = episodes_rollout(
        [episode(1), episode(0)], {0: [-1.0], 1: [-1.0]}, build_tools_tokenizer(), 2,
        torch.zeros(1, dtype=torch.int64),
    )  # fmt: skip
    assert env_metrics(rollout.batch)["env/dropped_observations_mean"] == 0.5


@pytest.fixture(autouse=True)
def _fixtures_importable(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "tests"))
