"""TRL/verl names in "did you mean": the one map, its suggestions, and the docs that show it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from posttrain.config import (
    PosttrainConfig,
    UnknownKeyError,
    all_keys,
    apply_overrides,
    load_config,
)
from posttrain.config.aliases import PEER_NAMES, peer_key, peer_table

DOCS = Path(__file__).resolve().parents[1] / "docs" / "guides"


@pytest.mark.parametrize(
    ("opt", "message"),
    [
        ("rl.learning_rate=1e-5", "did you mean rl.lr? (learning_rate in TRL)"),
        ("rollout.num_generations=8", "did you mean rollout.n? (num_generations in TRL)"),
        ("data.batch_size=16", "did you mean data.prompts_per_step? (batch_size in other"),
        ("data.train_batch_size=16", "did you mean data.prompts_per_step? (data.train_batch_size "
         "in verl)"),
        ("actor_rollout_ref.actor.clip_ratio_low=0.2", "did you mean rl.epsilon_low? "
         "(actor_rollout_ref.actor.clip_ratio_low in verl)"),
        ("rl.clip_ratio_high=0.28", "did you mean rl.epsilon_high? (actor_rollout_ref.actor."
         "clip_ratio_high in verl)"),
        ("rl.beta=0.04", "did you mean rl.kl_beta? (beta in TRL)"),
        ("rollout.max_completion_length=64", "did you mean rollout.max_tokens?"),
        ("data.max_steps=3", "did you mean rl.max_steps? (max_steps in TRL)"),
    ],
)  # fmt: skip
def test_peer_names_suggest_the_posttrain_key(opt, message):
    key = opt.split("=")[0]
    with pytest.raises(UnknownKeyError) as info:
        apply_overrides(PosttrainConfig(), [opt])
    assert str(info.value).startswith(f"unknown config key '{key}': {message}")


def test_a_recipe_assignment_gets_the_same_suggestion():
    cfg = PosttrainConfig()
    with pytest.raises(UnknownKeyError, match=r"did you mean rl\.lr\? \(learning_rate in TRL\)"):
        cfg.rl.learning_rate = 1e-5  # type: ignore[attr-defined]


def test_typos_still_get_the_nearest_key():
    with pytest.raises(UnknownKeyError) as info:
        load_config("arithmetic", ["--", "rl.epsilon_lo=0.1"])
    assert str(info.value) == "unknown config key 'rl.epsilon_lo': did you mean rl.epsilon_low?"
    assert peer_key("rl.lr") is None  # a valid key is nobody's alias


def test_every_entry_names_a_real_key_and_no_name_twice():
    keys = set(all_keys())
    assert {p.key for p in PEER_NAMES} <= keys
    assert len({p.key for p in PEER_NAMES}) == len(PEER_NAMES)
    verl = [p.verl for p in PEER_NAMES if p.verl]
    trl = [p.trl for p in PEER_NAMES if p.trl]
    assert len(set(verl)) == len(verl) and len(set(trl)) == len(trl)
    for p in PEER_NAMES:  # every name leads back to its own key
        for name in (p.trl, p.verl, *p.common):
            if name and _leaf(name) != _leaf(p.key):
                assert peer_key(f"xx.{name}" if "." not in name else name)[0] == p.key, name


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def test_the_config_guide_shows_the_map():
    assert peer_table() in (DOCS / "config.md").read_text(), (
        "docs/guides/config.md's TRL/verl table is not posttrain.config.aliases.peer_table(); "
        "replace it with that function's output"
    )


def _cell_names(cell: str) -> list[str]:
    """The plain names of a table cell: backticked identifiers outside parenthesised prose; a
    name without a dot after a dotted one shares its prefix (``a.b.c`` / ``d`` -> ``a.b.d``)."""
    cell = re.sub(r" \([^)]*\)", "", cell)
    names: list[str] = []
    for token in re.findall(r"`([^`]*)`", cell):
        if not re.fullmatch(r"[a-z_][a-z0-9_.]*", token):
            continue
        if "." not in token and names and "." in names[-1]:
            token = names[-1].rsplit(".", 1)[0] + "." + token
        names.append(token)
    return names


def test_the_objectives_guide_peer_table_agrees_with_the_map():
    text = (DOCS / "objectives.md").read_text()
    table = text.split("### Peer names", 1)[1].split("\n\n", 2)[1]
    by_key = {p.key: p for p in PEER_NAMES}
    checked = 0
    for row in table.splitlines()[2:]:
        ours, trl, verl = [c.strip() for c in row.strip("|").split("|")]
        if "=" in ours:
            continue  # a value mapping (rl.advantage_estimator=rloo), not a key name
        keys = _cell_names(ours)
        for column, cell in (("trl", trl), ("verl", verl)):
            names = _cell_names(cell)
            if "=" in cell or not names:
                continue
            assert len(names) == len(keys), row
            for key, name in zip(keys, names, strict=True):
                assert getattr(by_key[key], column) == name, (key, column, name)
                checked += 1
    assert checked >= 15
