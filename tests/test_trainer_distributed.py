"""Two gloo ranks produce exactly the single-process update, for every loss type."""

from __future__ import annotations

import sys
from pathlib import Path

import gloo_ranks
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from dp_cases import CASES, full_batch, reference, shard

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp")
    gloo_ranks.run(SCRIPTS / "dp_worker.py", [str(out)], 2, 180)
    return out, [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-300))


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_equal_single_process(ranks, name):
    _, results = ranks
    ref = reference(name)
    r0, r1 = results[0][name], results[1][name]
    batch = full_batch(name)
    tokens = [int(shard(name, batch, r).response_mask.sum()) for r in range(2)]
    assert tokens[0] != tokens[1]  # unequal token counts per rank
    assert r0["losses"] == pytest.approx(ref["losses"], rel=1e-12)
    assert r1["losses"] == r0["losses"]
    if ref["weights"][0] is not None:
        assert r0["weights"] == ref["weights"]  # the global weight, summed over ranks
    for p0, p1, g0, pr, gr in zip(
        r0["params"], r1["params"], r0["grads"], ref["params"], ref["grads"], strict=True
    ):
        assert torch.equal(p0, p1)  # ranks stay in lockstep
        assert rel_err(g0, gr) < 1e-12
        assert rel_err(p0, pr) < (1e-9 if CASES[name][6] == "adamw" else 1e-12)


def test_rank_merged_metrics_are_global_as_declared(ranks):
    """Every rank reports the step's global metrics: a declared max is the max over all rows of
    every rank, counts are summed; both equal the single-process run's."""
    _, results = ranks
    name = "pi_old_adamw_two_minis"
    ref = reference(name)["metrics"]
    r0, r1 = results[0][name]["metrics"], results[1][name]["metrics"]
    assert r0 == r1
    for got, want in zip(r0, ref, strict=True):
        assert got["train/samples"] == want["train/samples"]
        assert got["train/tokens"] == want["train/tokens"]
        assert got["train/pg/max_abs_log_ratio"] == pytest.approx(
            want["train/pg/max_abs_log_ratio"], rel=1e-9, abs=1e-15
        )
    assert ref[1]["train/pg/max_abs_log_ratio"] > 0  # the second update sees a moved policy


def test_per_rank_local_normalisation_would_differ(ranks):
    """Guard that the comparison can fail: averaging per-rank token means is not the answer."""
    _, results = ranks
    name = "token-mean"
    batch = full_batch(name)
    ref = reference(name)
    local = [reference_loss_on(shard(name, batch, r)) for r in range(2)]
    assert sum(local) / 2 != pytest.approx(ref["losses"][0], rel=1e-6)


def reference_loss_on(b):
    from dp_cases import objective_for
    from trainer_support import TinyCausalLM

    with torch.no_grad():
        return float(objective_for("token-mean")(TinyCausalLM(seed=0), b)[0])


def test_two_rank_checkpoint_has_every_rank_rng(ranks):
    out, _ = ranks
    ckpt = out / "ckpt" / "step_00000001"
    assert (ckpt / "COMPLETE").exists()
    assert (ckpt / "rng_rank0.pt").exists() and (ckpt / "rng_rank1.pt").exists()
    assert (ckpt / "model" / "model.safetensors").exists()
