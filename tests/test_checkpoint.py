"""Checkpoint layout, atomicity, retention, resume modes and compatibility checks."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from trainer_support import VOCAB, pg_objective, tiny_llama

from posttrain.testing import synthetic_batch
from posttrain.trainer import (
    CheckpointError,
    CheckpointManager,
    LLMTrainer,
    PoisonedStateError,
    ResumeError,
)
from posttrain.trainer.manifest import CorruptCheckpointError, write_manifest
from posttrain.trainer.rng import get_rng_state, set_rng_state

CONFIG = {"job": {"name": "t"}, "rl": {"max_steps": 4, "lr": 1e-2}, "logging": {"every": 1}}


def make_trainer(loss_type="token-mean", dtype=torch.float32):
    return LLMTrainer(
        tiny_llama(dtype=dtype),
        pg_objective(loss_type, use_pi_old=True),
        lr=1e-2,
        micro_batch_size=3,
        weight_decay=0.01,
        lr_schedule="linear",
        total_steps=4,
    )


def train_step(trainer, cursor):
    b = synthetic_batch(VOCAB, 6, seed=cursor, sample_id_offset=6 * cursor)
    b = b[torch.randperm(len(b))]  # consumes the global torch RNG, which resume must restore
    return [m["train/loss"] for m in trainer.train_on_batch(b, mini_batches=2)]


@pytest.fixture
def saved(tmp_path):
    trainer = make_trainer()
    train_step(trainer, 0)
    manager = CheckpointManager(tmp_path / "ckpt", keep_last=2)
    path = manager.save(
        1, trainer, config=CONFIG, data_state={"cursor": 1, "order": torch.arange(3)}
    )
    return trainer, manager, path


def test_layout_loads_with_from_pretrained_and_weights_only(saved):
    from transformers import AutoModelForCausalLM

    trainer, _, path = saved
    assert path.name == "step_00000001" and (path / "COMPLETE").exists()
    loaded = AutoModelForCausalLM.from_pretrained(path / "model")
    for (n, p), q in zip(
        trainer.model.state_dict().items(), loaded.state_dict().values(), strict=True
    ):
        assert torch.equal(p, q), n
    state = torch.load(path / "trainer.pt", weights_only=True)
    assert state["global_step"] == 2 and state["optimizer"]["state"]
    assert torch.equal(
        torch.load(path / "data_state.pt", weights_only=True)["order"], torch.arange(3)
    )
    assert set(torch.load(path / "rng_rank0.pt", weights_only=True)) == {
        "python",
        "numpy",
        "torch",
        "cuda",
    }
    meta = json.loads((path / "meta.json").read_text())
    assert meta["step"] == 1 and meta["world_size"] == 1 and meta["config"] == CONFIG
    assert meta["objective_identity"] == {
        "objective": "test_pg",
        "loss_type": "token-mean",
        "pi_old": True,
    }


def test_half_written_and_incomplete_dirs_are_skipped_with_a_warning(saved):
    _, manager, path = saved
    (manager.root / ".tmp-step_00000009" / "model").mkdir(parents=True)
    (manager.root / "step_00000008").mkdir()
    with pytest.warns(UserWarning) as record:
        assert manager.resume(make_trainer(), mode="must", config=CONFIG).path == path
    text = " ".join(str(w.message) for w in record)
    assert "removing half-written checkpoint" in text and ".tmp-step_00000009" in text
    assert "step_00000008 does not verify: no COMPLETE marker" in text
    assert sorted(p.name for p in manager.root.iterdir()) == [
        ".corrupt-step_00000008", "step_00000001",
    ]  # fmt: skip


def test_keep_last_k(saved):
    trainer, manager, _ = saved
    for step in (2, 3, 4):
        manager.save(step, trainer, config=CONFIG)
    assert sorted(p.name for p in manager.root.iterdir()) == ["step_00000003", "step_00000004"]
    assert not list(manager.root.glob(".tmp-*"))


def test_resave_same_step_replaces_it(saved):
    trainer, manager, path = saved
    manager.save(1, trainer, config=CONFIG, data_state={"cursor": 7})
    assert torch.load(path / "data_state.pt", weights_only=True) == {"cursor": 7}
    assert [p.name for p in manager.root.iterdir()] == ["step_00000001"]


def test_resume_modes(tmp_path, saved):
    _, manager, path = saved
    fresh = CheckpointManager(tmp_path / "empty")
    assert fresh.resume(make_trainer(), mode="auto", config=CONFIG) is None
    assert fresh.resume(make_trainer(), mode="off", config=CONFIG) is None
    with pytest.raises(ResumeError, match="resume=must but .* holds no complete checkpoint"):
        fresh.resume(make_trainer(), mode="must", config=CONFIG)
    with pytest.raises(ResumeError, match="pick a new job.name"):
        manager.resume(make_trainer(), mode="off", config=CONFIG)
    with pytest.raises(ValueError, match="resume mode must be one of"):
        manager.resume(make_trainer(), mode="yes", config=CONFIG)
    for mode in ("auto", "must"):
        state = manager.resume(make_trainer(), mode=mode, config=CONFIG)
        assert state.path == path and state.step == 1 and state.data_state["cursor"] == 1


def test_resume_off_refuses_a_dir_with_only_a_crashed_save(tmp_path):
    manager = CheckpointManager(tmp_path)
    (tmp_path / ".tmp-step_00000001").mkdir()
    with pytest.raises(ResumeError, match="already holds checkpoints"):
        manager.resume(make_trainer(), mode="off", config=CONFIG)


def test_different_objective_identity_is_refused_with_the_key(saved):
    _, manager, _ = saved
    with pytest.raises(ResumeError, match=r"objective identity differs in \['loss_type'\]"):
        manager.resume(make_trainer("seq-mean-token-sum"), mode="auto", config=CONFIG)


def test_incompatible_config_lists_keys_and_allowed_keys_pass(saved):
    _, manager, _ = saved
    bad = {**CONFIG, "rl": {"max_steps": 4, "lr": 2e-2}, "model": {"name": "x"}}
    with pytest.raises(ResumeError, match=r"config differs in \['model.name', 'rl.lr'\]") as e:
        manager.resume(make_trainer(), mode="auto", config=bad)
    assert "checkpoint=0.01 now=0.02" in str(e.value)
    longer = {**CONFIG, "rl": {"max_steps": 40, "lr": 1e-2}, "logging": {"every": 5}}
    assert manager.resume(make_trainer(), mode="auto", config=longer).step == 1


def test_poisoned_state_is_never_saved(tmp_path):
    trainer = make_trainer()
    with torch.no_grad():
        next(trainer.model.parameters())[0, 0] = float("nan")
    manager = CheckpointManager(tmp_path)
    with pytest.raises(PoisonedStateError, match="holds NaN or inf"):
        manager.save(1, trainer, config=CONFIG)
    assert not manager.has_any()


def test_load_refuses_other_dtype_and_takes_another_world_size(saved):
    _, manager, path = saved
    with pytest.raises(CheckpointError, match="torch.float32.* but the model holds torch.float64"):
        manager.load(path, make_trainer(dtype=torch.float64), config=CONFIG)
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "world_size": 2}))
    with pytest.raises(CorruptCheckpointError, match="meta.json has .* bytes"):
        manager.load(path, make_trainer(), config=CONFIG)
    write_manifest(path, 1)  # as if 2 replicated ranks had written it: each held this state
    assert manager.load(path, make_trainer(), config=CONFIG).step == 1


def test_rng_state_round_trip():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    np.random.randn()  # leaves a cached gaussian in the numpy state
    state = get_rng_state()
    first = (random.random(), np.random.randn(), torch.rand(2))
    set_rng_state(state)
    again = (random.random(), np.random.randn(), torch.rand(2))
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])


def test_in_process_resume_is_bit_exact(tmp_path):
    """Straight 3 steps vs 1 step + save + fresh process state + resume for 2 steps."""
    torch.manual_seed(0)
    straight = make_trainer()
    losses = [train_step(straight, c) for c in range(3)]

    torch.manual_seed(0)
    first = make_trainer()
    resumed_losses = [train_step(first, 0)]
    manager = CheckpointManager(tmp_path)
    manager.save(1, first, config=CONFIG, data_state={"cursor": 1})
    torch.manual_seed(123)  # a new process would not share the old RNG
    second = make_trainer()
    state = manager.resume(second, mode="must", config=CONFIG)
    resumed_losses += [train_step(second, c) for c in range(state.data_state["cursor"], 3)]

    assert resumed_losses == losses
    for p, q in zip(straight.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(p, q)
    a, b = straight.optimizer.state_dict(), second.optimizer.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for k in a["state"]:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(a["state"][k][name], b["state"][k][name])
