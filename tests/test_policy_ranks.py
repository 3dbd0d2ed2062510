"""The policy-only language-model entries on more than one policy rank: each recipe on one
in-process rank and on two Ray ranks (replicated, and FSDP-sharded) gives the same run to float32
rounding: loss, gradient norm, the entry's token or pair counts, held-out metrics, and the final
weights. Both losses are sums divided once by a global count (assistant tokens, pairs), so the
rank split does not change them.

SFT: the FSDP run also packs and uses other micro-batches (neither changes a token sum). DPO:
LoRA, so the reference is the sharded policy with its adapters off, scored in lockstep too. The
ranks hold unequal shares (7 rows or 5 pairs a step, 31 rows or 7 pairs held out) in unequal
numbers of micro-batches, so the sharded ranks run ghost passes in the update, the reference
scoring and the held-out evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from safetensors.torch import load_file  # noqa: E402

from posttrain.config import load_config  # noqa: E402
from posttrain.entrypoints import lmdpo, sft  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STEPS = 3
RAY = {"placement.backend": "ray", "placement.cpus_per_role": 0.5, "placement.policy_ranks": 2}
FSDP = {**RAY, "placement.policy_sharding": "fsdp"}
#: Entry -> (recipe, its module, data folder, held-out rows kept, options of every run, runs).
ENTRIES = {
    "sft": ("sft_tools_tiny", sft, "examples/sft_tools_tiny", 31,
            {"sft.rows_per_step": 7, "rl.micro_batch_size": 3}, {
                "two ranks": RAY,
                # Three 39-token rows a sequence: a step's 7 rows pack into 3 (3 + 3 + 1), 2 on
                # rank 0 and 1 on rank 1; one a micro-batch, so rank 1 runs a ghost pass.
                "two FSDP ranks, packed": {**FSDP, "sft.packing": True, "sft.max_tokens": 120,
                                           "rl.micro_batch_size": 1},
            }),
    "lmdpo": ("lmdpo_tools_tiny", lmdpo, "examples/lmdpo_tools_tiny", 7,
              {"lmdpo.pairs_per_step": 5, "rl.micro_batch_size": 2, "model.lora_rank": 4,
               "model.lora_alpha": 8}, {"two ranks": RAY, "two FSDP ranks": FSDP}),
}  # fmt: skip


def opts_for(name: str, root: Path, val: Path, **extra) -> list[str]:
    _, _, data, _, common, _ = ENTRIES[name]
    opts = {
        "job.output_root": str(root / "out"),
        "model.name_or_path": str(root.parent / "model"),
        f"{name}.train_path": str(REPO / data / "train.jsonl"),
        f"{name}.val_path": str(val),
        **common,
        # SGD: the weights move by the gradient itself, so they show a doubled or lost share
        # (AdamW's normalised step would hide a scale and amplify rounding in tiny gradients).
        "rl.optimizer": "sgd",
        "rl.lr": 0.5,
        "rl.max_steps": STEPS,
        "rl.eval_every": STEPS,
        "rl.save_every": STEPS,
        "logging.progress": False,
        **extra,
    }
    return [f"{k}={v}" for k, v in opts.items()]


@pytest.fixture(scope="module", params=list(ENTRIES))
def runs(request, ray_cluster, tmp_path_factory):
    name = request.param
    recipe, module, data, kept, _, others = ENTRIES[name]
    root = tmp_path_factory.mktemp(name)
    val = root / "val.jsonl"
    val.write_text("".join((REPO / data / "val.jsonl").read_text().splitlines(True)[:kept]))
    out = {}
    for i, (run, extra) in enumerate({"one rank": {}, **others}.items()):
        opts = opts_for(name, root / str(i), val, **extra)
        out[run] = module.run(load_config(recipe, ["--", *opts]), recipe, opts)
    return name, root / "model", out


def rows_of(summary: dict) -> dict[int, dict]:
    text = (Path(summary["run_dir"]) / "metrics.jsonl").read_text()
    return {r["step"]: r for r in map(json.loads, text.splitlines())}


def weights(folder: str | Path) -> dict:
    """Every tensor of an exported model (a sharded run's export has several files)."""
    return {
        k: v for f in sorted(Path(folder).glob("*.safetensors")) for k, v in load_file(f).items()
    }


#: Per entry: its count (exact), the train metrics to float32 rounding, the held-out ones.
COUNTS = {"sft": "train/sft/tokens", "lmdpo": "train/samples"}
HELD_OUT = {
    "sft": ("val/tokens", "val/loss", "val/token_accuracy"),
    "lmdpo": ("val/pairs", "val/loss", "val/rewards/accuracies", "val/rewards/margins"),
}


#: DPO's pair accuracy counts margins above 0; before the first step LoRA is the reference, so
#: every margin is 0 up to rounding, and which forward rounds it up (the FSDP ranks' full
#: forwards, the one rank's shared-prefix one) decides it. The margins themselves are compared.
UNDEFINED_AT_START = {(0, "val/rewards/accuracies")}


def test_two_ranks_make_the_one_rank_run(runs):
    name, model, out = runs
    a = rows_of(out["one rank"])
    initial = weights(model)
    want = weights(out["one rank"]["final_model"])
    assert a[STEPS]["val/loss"] < a[0]["val/loss"]  # it learned
    for run in out.keys() - {"one rank"}:
        b = rows_of(out[run])
        assert sorted(a) == sorted(b) == list(range(STEPS + 1)), run
        for step in range(1, STEPS + 1):
            ra, rb = a[step], b[step]
            assert rb[COUNTS[name]] == ra[COUNTS[name]] > 0, run
            assert rb["train/loss"] == pytest.approx(ra["train/loss"], rel=1e-6), run
            assert rb["train/grad_norm"] == pytest.approx(ra["train/grad_norm"], rel=1e-5), run
        for step in (0, STEPS):  # the held-out set, split over the ranks and summed
            count, *metrics = HELD_OUT[name]
            assert b[step][count] == a[step][count] > 0, run
            for k in metrics:
                if (step, k) in UNDEFINED_AT_START:
                    continue
                assert b[step][k] == pytest.approx(a[step][k], rel=1e-5, abs=1e-7), (run, k)
        got = weights(out[run]["final_model"])
        for k, w in want.items():  # the update, to float32 rounding
            moved = float((w - initial[k]).norm())
            assert float((got[k] - w).norm()) <= 1e-5 * moved + 1e-7, (run, k)
    assert max(float((w - initial[k]).norm() / initial[k].norm()) for k, w in want.items()) > 1e-3
