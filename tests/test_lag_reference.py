"""The KL reference on the data side (``placement.reference_on``), in process: the key, where
``auto`` puts it, its log-probs against the policy side's bit for bit, and π_old's forwards.

The policy side's reference log-probs are recorded as its objective scores them (each update
micro-batch's ``ReferenceScorer`` call) and compared row by row with what the reference role
annotates on the collected batch, for each way the update cuts a batch into micro-batches.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from posttrain.algorithm.primitives.objective import REFERENCE_COLUMN, ReferenceScorer
from posttrain.config import ConfigError, load_config
from posttrain.config.build import build_objective, reference_on_data
from posttrain.control import PreflightError, run_preflight
from posttrain.control.data_checks import load_tasks
from posttrain.entrypoints import grpo
from posttrain.model.loading import load_tokenizer
from posttrain.model.tiny import build_tiny_model
from posttrain.placement.dispatch import shard_batch
from posttrain.placement.local import place_local
from posttrain.placement.reference import ReferenceRole
from posttrain.placement.roles import PolicyRole
from posttrain.run.online import collect


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def cfg(tiny_dir: Path, root: Path, *opts: str):
    base = (
        f"model.name_or_path={tiny_dir}", f"job.output_root={root}", "rl.grpo_surrogate=clipped",
        "rl.kl_beta=0.1", "data.train_size=40", "data.val_size=4", "data.prompts_per_step=4",
        "rollout.n=4", "rollout.max_tokens=6", "logging.progress=false",
    )  # fmt: skip
    return load_config("arithmetic", ["--", *base, *opts])


# -- the key ---------------------------------------------------------------------------------


def test_a_bad_reference_on_is_one_line_naming_the_key():
    with pytest.raises(ConfigError) as e:
        load_config("arithmetic", ["--", "placement.reference_on=rollout"])
    assert str(e.value).startswith("invalid config value placement.reference_on:")
    assert "\n" not in str(e.value)


def test_reference_on_without_a_reference_is_refused_in_one_line():
    with pytest.raises(PreflightError) as e:
        run_preflight(load_config("arithmetic", ["--", "placement.reference_on=data"]))
    assert e.value.violations == [
        "placement.reference_on=data is never read: the run has no frozen reference "
        "(rl.kl_beta=0, or its objective reads no rl.kl_beta); reset with "
        "placement.reference_on=@default (-> 'auto') or set rl.kl_beta > 0"
    ]


def test_auto_scores_on_the_data_side_under_a_lag_only(tiny_dir, tmp_path):
    def on_data(*opts):
        return reference_on_data(cfg(tiny_dir, tmp_path, "placement.backend=ray", *opts))

    assert on_data("rl.off_policy_lag=1") and not on_data()
    assert on_data("placement.reference_on=data") and not on_data(
        "rl.off_policy_lag=1", "placement.reference_on=policy"
    )
    assert not on_data("rl.off_policy_lag=1", "rl.kl_beta=0")  # no reference at all


# -- the log-probs -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def collected(tiny_dir, tmp_path_factory):
    """One real collected batch (4 groups of 4, responses of different lengths)."""
    root = tmp_path_factory.mktemp("batch")
    config = cfg(tiny_dir, root, "rl.kl_beta=0")
    roles = place_local(config, build_objective, str(root))
    tokenizer = load_tokenizer(str(tiny_dir))
    _, result, _ = collect(config, roles, tokenizer, load_tasks(config), 0, 1)
    batch = result.batch
    assert len(set(batch.response_mask.sum(1).tolist())) > 1  # the micro-batches trim differently
    return batch


@pytest.mark.parametrize(
    "opts",
    [
        (),  # the recipe's micro-batch holds the whole batch
        ("rl.micro_batch_size=4",),
        ("rl.micro_batch_size=3",),
        ("rl.micro_batch_size=3", "rl.shared_prefix=off"),
        ("rl.micro_batch_tokens=60",),
        ("rl.micro_batch_size=4", "rl.mini_batch_per_replica=2"),
        ("rl.micro_batch_size=4", "model.dtype=bfloat16"),
        ("rl.micro_batch_size=4", "model.lora_rank=4", "model.lora_alpha=8"),
        ("rl.micro_batch_size=3", "placement.policy_ranks=2"),
    ],
    ids=lambda o: " ".join(o) or "whole-batch",
)
def test_data_side_log_probs_equal_the_policy_sides_bit_for_bit(
    opts, collected, tiny_dir, tmp_path, monkeypatch
):
    ranks = 2 if "placement.policy_ranks=2" in opts else 1
    local = [o for o in opts if not o.startswith("placement.policy_ranks")]
    policy_cfg = cfg(tiny_dir, tmp_path, "placement.reference_on=policy", *local)
    data_cfg = cfg(tiny_dir, tmp_path, "placement.backend=ray", "placement.reference_on=data",
                   *opts)  # fmt: skip
    seen: dict[int, torch.Tensor] = {}
    score = ReferenceScorer.__call__

    def record(self, batch):
        out = score(self, batch)
        seen.update({s: row.clone() for s, row in zip(batch.sample_ids.tolist(), out, strict=True)})
        return out

    monkeypatch.setattr(ReferenceScorer, "__call__", record)
    policy = PolicyRole(policy_cfg, build_objective, str(tmp_path))
    keep = policy.trainer.keeps_groups
    for shard in shard_batch(collected, ranks, policy_cfg.rl.mini_batch_per_replica, keep):
        policy.train(shard)  # one rank's update at a time: the micro-batches are the same
    annotated = ReferenceRole(data_cfg).annotations(collected)[REFERENCE_COLUMN]
    assert sorted(seen) == collected.sample_ids.tolist()
    for row, sid in enumerate(collected.sample_ids.tolist()):
        assert torch.equal(annotated[row], seen[sid]), f"row {row}"


def test_the_scorer_reads_the_column_and_refuses_a_batch_without_it(collected, tiny_dir, tmp_path):
    from posttrain.algorithm.primitives.objective import (
        DataSideReference,
        ObjectiveContractError,
    )

    scorer = ReferenceScorer(DataSideReference())
    column = torch.randn(collected.response_mask.shape)
    batch = collected.replace(columns={REFERENCE_COLUMN: column})
    assert scorer(batch[[2, 0]]).equal(column[[2, 0]])
    with pytest.raises(ObjectiveContractError, match="no 'reference_logprobs' column"):
        scorer(collected)


# -- π_old and the policy's forwards ---------------------------------------------------------------


@pytest.mark.parametrize("minis, forwards", [(1, 4), (2, 8)])
def test_one_update_per_batch_runs_no_pi_old_forward(minis, forwards, collected, tiny_dir,
                                                     tmp_path):  # fmt: skip
    """16 rows in micro-batches of 4, one model call each (no shared-prefix encoding): one
    update per batch is 4 policy forwards (π_old is each one's detached output); two updates
    add the frozen capture's 4. With the reference on the data side the policy ranks hold no
    reference at all."""
    config = cfg(tiny_dir, tmp_path, "placement.reference_on=data", "rl.micro_batch_size=4",
                 "rl.shared_prefix=off", f"rl.mini_batch_per_replica={minis}")  # fmt: skip
    policy = PolicyRole(config, build_objective, str(tmp_path))
    assert policy.trainer.auxiliary_models == ()
    calls = []
    policy.model.register_forward_hook(lambda *a: calls.append(1))
    batch = collected.replace(
        columns={REFERENCE_COLUMN: ReferenceRole(config).annotations(collected)[REFERENCE_COLUMN]}
    )
    policy.train(batch)
    assert len(calls) == forwards


# -- a whole run -------------------------------------------------------------------------------


def _run(tiny_dir: Path, root: Path, where: str) -> tuple[list[dict], dict]:
    opts = ["reward.functions=[role_fixtures:digit_reward]",f"model.name_or_path={tiny_dir}", f"job.output_root={root}", "rl.max_steps=3",
            "rl.grpo_surrogate=clipped", "rl.kl_beta=0.1", "rl.lr=0.01", "data.train_size=40",
            "data.val_size=4", "data.prompts_per_step=4", "rollout.n=4", "rollout.max_tokens=6",
            "rl.micro_batch_size=4", "rl.eval_every=0", "rl.save_every=3",
            "logging.progress=false", f"placement.reference_on={where}"]  # fmt: skip
    config = load_config("arithmetic", ["--", *opts])
    summary = grpo.run(config, "arithmetic", opts, grpo.default_out_dir(config), build_objective)
    run = Path(summary["run_dir"])
    rows = [
        {k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))}
        for line in (run / "metrics.jsonl").read_text().splitlines()
    ]
    weights = load_file(str(run / "checkpoints" / "step_00000003" / "model" / "model.safetensors"))
    return rows, weights


def test_a_run_with_the_reference_on_the_data_side_is_the_policy_sides_bit_for_bit(
    tiny_dir, tmp_path
):
    rows_p, weights_p = _run(tiny_dir, tmp_path / "policy", "policy")
    rows_d, weights_d = _run(tiny_dir, tmp_path / "data", "data")
    assert rows_d == rows_p and any(r.get("train/pg/kl_ref", 0) > 0 for r in rows_p)
    assert weights_d.keys() == weights_p.keys()
    assert all(torch.equal(weights_d[k], weights_p[k]) for k in weights_p)
