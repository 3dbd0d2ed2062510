"""Issue 24 item 3: building the starting tiny model survives kill -9 and concurrent runs."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from posttrain.model import tiny
from posttrain.model.errors import ModelLoadError
from posttrain.model.loading import load_policy
from posttrain.run.online import ensure_model


def _config(path: Path, preset: str = "arith", seed: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        model=SimpleNamespace(name_or_path=str(path), init_preset=preset),
        job=SimpleNamespace(seed=seed),
    )


# The child builds the model and SIGKILLs itself the moment the weights start being written:
# config.json is already on disk then when a build writes in place.
_KILLED_BUILD = """
import os, signal, sys
from types import SimpleNamespace
import transformers.modeling_utils as mu
from posttrain.run.online import ensure_model

def die(*a, **k):
    os.kill(os.getpid(), signal.SIGKILL)

mu.safe_save_file = die
cfg = SimpleNamespace(model=SimpleNamespace(name_or_path=sys.argv[1], init_preset="arith"),
                      job=SimpleNamespace(seed=0))
ensure_model(cfg)
"""


def test_kill_during_first_build_does_not_poison_later_runs(tmp_path):
    path = tmp_path / "models" / "arith-init"
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_BUILD, str(path)], capture_output=True, text=True
    )
    assert child.returncode == -9, child.stderr
    assert not (path / "config.json").exists()  # nothing that looks like a model was left
    ensure_model(_config(path))  # the next run builds it
    model, _ = load_policy(path)
    assert sum(p.numel() for p in model.parameters()) == 34_336
    assert not list(path.parent.glob(".tmp-build-*"))


def _half_built(path: Path, preset: str) -> None:
    """What a build that wrote in place left after a kill: config files, no weights."""
    path.mkdir(parents=True)
    tiny.tiny_config(preset).save_pretrained(path)


def test_half_built_folder_of_an_old_version_is_rebuilt(tmp_path, caplog):
    path = tmp_path / "arith-init"
    _half_built(path, "arith")
    with caplog.at_level(logging.WARNING, logger="posttrain"):
        ensure_model(_config(path))
    assert "half-built arith model" in caplog.text and "rebuilding it" in caplog.text
    load_policy(path)


def test_half_built_folder_of_another_model_is_refused(tmp_path):
    path = tmp_path / "mine"
    _half_built(path, "tiny")  # not what init_preset=arith builds: not ours to overwrite
    with pytest.raises(ModelLoadError, match="not a 'arith' model that model.init_preset=arith"):
        ensure_model(_config(path))
    assert not (path / "model.safetensors").exists()


def test_an_older_build_of_the_preset_is_used_with_a_warning(tmp_path, caplog):
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrain.model.tokenizer import save_char_tokenizer

    path = tmp_path / "arith-tools-init"  # arith_tools as it was: the same layers, full attention
    config = tiny.tiny_config("arith_tools").to_dict()
    for key in ("sliding_window", "model_type"):
        config.pop(key)
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(path)
    save_char_tokenizer(tiny.preset_tokenizer("arith_tools"), path)
    with caplog.at_level(logging.WARNING, logger="posttrain"):
        assert not tiny.ensure_tiny_model("arith_tools", path)  # nothing rebuilt
    assert caplog.messages == [
        f"model folder {path} holds a arith_tools model built by an older version (another "
        "architecture); using it as it is (delete it to have it rebuilt)"
    ]
    caplog.clear()
    other = tiny.build_tiny_model("tiny", tmp_path / "mine")  # another model: the user's choice
    own = tiny.build_tiny_model("arith_tools", tmp_path / "own")
    with caplog.at_level(logging.WARNING, logger="posttrain"):
        assert not tiny.ensure_tiny_model("arith_tools", other)
        assert not tiny.ensure_tiny_model("arith_tools", own)
    assert caplog.messages == []


def test_concurrent_builders_agree(tmp_path, monkeypatch):
    path = tmp_path / "shared"
    builds = []
    real = tiny.build_tiny_model

    def counted(*args, **kwargs):
        builds.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(tiny, "build_tiny_model", counted)
    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(tiny.ensure_tiny_model("arith", path)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, True] and len(builds) == 1
    load_policy(path)


def test_existing_empty_folder_is_filled(tmp_path):
    path = tmp_path / "empty"
    path.mkdir()
    assert tiny.build_tiny_model("arith", path) == path
    load_policy(path)
