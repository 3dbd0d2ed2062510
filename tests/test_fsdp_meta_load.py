"""Sharded ranks other than 0 load on the meta device and receive their shards from rank 0.

Two gloo ranks (``scripts/meta_load_worker.py``) build the ``tiny`` policy both ways, with and
without LoRA: every rank loading the full weights (the path before meta loading), and rank 1
building a skeleton on the meta device. The local shards (parameters and buffers) right after
loading, and after two GRPO steps, must be bit-identical between the two ways.
"""

from __future__ import annotations

from pathlib import Path

import gloo_ranks
import pytest
import torch

from posttrain.model.loading import load_policy
from posttrain.model.tiny import build_tiny_model
from posttrain.trainer import LLMTrainer

WORKER = Path(__file__).parent / "scripts" / "meta_load_worker.py"


def launch(jobs: list[dict], world: int = 2, timeout: float = 240) -> None:
    gloo_ranks.launch(WORKER, jobs, world, timeout)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tiny = build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)
    out = tmp_path_factory.mktemp("meta")
    jobs = [
        {"model": str(tiny), "skeleton": skeleton, "lora": lora, "out": str(out / f"{name}")}
        for lora in (0, 4)
        for skeleton, name in ((False, f"full-{lora}"), (True, f"meta-{lora}"))
    ]
    launch(jobs)
    return out


@pytest.mark.parametrize("lora", [0, 4])
@pytest.mark.parametrize("rank", [0, 1])
def test_meta_loading_gives_the_full_loads_shards_bit_for_bit(results, lora, rank):
    full = torch.load(results / f"full-{lora}-rank{rank}.pt", weights_only=True)
    meta = torch.load(results / f"meta-{lora}-rank{rank}.pt", weights_only=True)
    for when in ("loaded", "trained"):
        a, b = full[when], meta[when]
        assert a.keys() == b.keys()
        for k in a:
            assert not b[k].is_meta and b[k].device.type == "cpu", k
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), (when, k)
    # It trained, and the adapters (LoRA) or the weights moved.
    assert any(not torch.equal(full["loaded"][k], full["trained"][k]) for k in full["loaded"])


def test_a_skeleton_reads_no_weights(tmp_path):
    tiny = build_tiny_model("tiny", tmp_path / "tiny", seed=0)
    (tiny / "model.safetensors").write_bytes(b"not weights")  # a skeleton never opens them
    model, tok = load_policy(tiny, skeleton=True)
    assert all(p.is_meta for p in model.parameters()) and tok.pad_token_id is not None


def test_a_skeleton_stops_where_the_loaded_model_stops(tmp_path):
    """A generation config's EOS ids beyond config.json's (Qwen2.5-Instruct lists two) are stop
    ids: the vLLM engine takes them from a skeleton, the torch engine from the loaded model."""
    from transformers import GenerationConfig

    from posttrain.rollout.base import stop_and_pad_ids

    tiny = build_tiny_model("tiny", tmp_path / "tiny", seed=0)
    GenerationConfig(eos_token_id=[2, 7], pad_token_id=0).save_pretrained(tiny)
    loaded, tok = load_policy(tiny)
    skeleton, _ = load_policy(tiny, skeleton=True)
    stops = stop_and_pad_ids(loaded, tok)
    assert 7 in stops[0] and stop_and_pad_ids(skeleton, tok) == stops


def test_an_unsharded_skeleton_is_refused(tmp_path):
    from posttrain.config import PosttrainConfig
    from posttrain.config.build import build_objective, objective_context

    model, _ = load_policy(build_tiny_model("tiny", tmp_path / "tiny", seed=0), skeleton=True)
    cfg = PosttrainConfig()
    with pytest.raises(ValueError, match="meta device needs sharding='fsdp'"):
        LLMTrainer(model, build_objective(cfg.rl, objective_context(cfg)), lr=1e-3,
                   micro_batch_size=1)  # fmt: skip
