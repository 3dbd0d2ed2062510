"""Weight sync in buckets and adapter-only LoRA sync, in-process (the Ray and FSDP paths are in
``test_weight_sync_ray.py``).

Every comparison is against what the rollout held after the sync it replaces: the policy's
whole state dict loaded at once (``load_state_dict``; with LoRA, :func:`merged_state`'s merged
weights). Equality is bit-for-bit, of the weights and of what the rollout then samples.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain.config import load_config
from posttrain.config.build import build_objective
from posttrain.entrypoints.cli import main
from posttrain.model.lora import adapter_bytes, merged_state
from posttrain.model.tiny import build_tiny_model
from posttrain.placement.local import LocalRoles
from posttrain.placement.roles import PolicyRole, RolloutRole
from posttrain.placement.weight_sync import WeightSink, WeightSource, bucket_bytes, plan_buckets
from posttrain.rollout import GraphRolloutEngine
from posttrain.testing import synthetic_batch

pytest.importorskip("peft")

LORA = ["model.lora_rank=4", "model.lora_alpha=8", "model.lora_target_modules=[q_proj,v_proj]"]
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def config(tiny_dir, tmp_path, *extra):
    opts = [f"model.name_or_path={tiny_dir}", f"job.output_root={tmp_path}",
            "placement.sync_bucket_mb=0.02", *extra]  # fmt: skip
    return load_config("arithmetic", ["--", *opts])


def trained_policy(cfg, tmp_path) -> PolicyRole:
    """A policy one real update away from the weights it loaded (so a sync has news)."""
    policy = PolicyRole(cfg, build_objective, str(tmp_path / "run"))
    vocab = policy.model.config.vocab_size
    policy.trainer.train_on_batch(synthetic_batch(vocab, 4, seed=3))
    return policy


def todays_rollout(cfg, state) -> RolloutRole:
    """A rollout holding ``state`` loaded whole: the sync bucketing replaces."""
    rollout = RolloutRole(cfg)
    rollout.engine.model.load_state_dict(state, strict=True)
    return rollout


def assert_same_weights(got: torch.nn.Module, want: torch.nn.Module) -> None:
    want_state = want.state_dict()
    for name, value in got.state_dict().items():
        assert torch.equal(value, want_state[name]), name


def assert_same_samples(got: RolloutRole, want: RolloutRole) -> None:
    a = got.engine.generate(PROMPTS, n=3, max_tokens=6, temperature=1.0, seed=7)
    b = want.engine.generate(PROMPTS, n=3, max_tokens=6, temperature=1.0, seed=7)
    assert torch.equal(a.batch.input_ids, b.batch.input_ids)
    assert torch.equal(a.batch.rollout_logprobs, b.batch.rollout_logprobs)


def test_buckets_hold_at_most_the_limit_or_one_larger_tensor(tiny_dir, tmp_path):
    policy = trained_policy(config(tiny_dir, tmp_path), tmp_path)
    limit = bucket_bytes(0.02)
    source = WeightSource(policy.model, limit)
    assert len(source.buckets) > 4
    for bucket in source.buckets:
        size = sum(u.nbytes for u in bucket)
        assert size <= limit or len(bucket) == 1
    units = [u for b in source.buckets for u in b]
    assert plan_buckets(units, 10**12) == [units]  # one bucket: the whole state dict at once
    # Tied input/output embeddings travel once.
    sent = {k for i in range(len(source.buckets)) for k in source.bucket(i)}
    full = policy.model.state_dict()
    assert set(full) - sent == {"lm_head.weight"}


def test_bucketed_sync_equals_loading_the_whole_state_dict(tiny_dir, tmp_path):
    cfg = config(tiny_dir, tmp_path)
    policy = trained_policy(cfg, tmp_path)
    rollout = RolloutRole(cfg)
    roles = LocalRoles(policy, rollout, None)
    assert roles.sync_weights() == 1
    want = todays_rollout(cfg, policy.model.state_dict())
    assert_same_weights(rollout.engine.model, want.engine.model)
    assert_same_samples(rollout, want)
    tied = rollout.engine.model
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()
    params = {p.data_ptr(): p for p in policy.model.parameters()}.values()
    assert roles.last_sync["sync/bytes"] == sum(p.numel() * 4 for p in params)
    assert roles.last_sync["sync/buckets"] > 4


def test_static_engine_takes_buckets_in_place(tiny_dir, tmp_path):
    cfg = config(tiny_dir, tmp_path, "rollout.engine=static")
    policy = trained_policy(cfg, tmp_path)
    rollout = RolloutRole(cfg)
    assert isinstance(rollout.engine, GraphRolloutEngine)
    storage = [p.data_ptr() for p in rollout.engine.model.parameters()]
    LocalRoles(policy, rollout, None).sync_weights()
    assert [p.data_ptr() for p in rollout.engine.model.parameters()] == storage
    assert_same_weights(
        rollout.engine.model, todays_rollout(cfg, policy.model.state_dict()).engine.model
    )


def test_lora_sync_sends_only_adapters_and_samples_as_merged_weights(tiny_dir, tmp_path):
    cfg = config(tiny_dir, tmp_path, *LORA)
    policy = trained_policy(cfg, tmp_path)
    rollout = RolloutRole(cfg)
    roles = LocalRoles(policy, rollout, None)
    roles.sync_weights()
    assert roles.last_sync["sync/bytes"] == adapter_bytes(policy.model)
    adapters = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert (
        roles.last_sync["sync/tensors"]
        == len(adapters)
        == 4 * policy.model.config.num_hidden_layers
    )
    want = todays_rollout(cfg, merged_state(policy.model))
    assert_same_weights(rollout.engine.model, want.engine.model)
    assert_same_samples(rollout, want)
    # A second update merges onto the loaded base again, not onto the last merge.
    vocab = policy.model.config.vocab_size
    policy.trainer.train_on_batch(synthetic_batch(vocab, 4, seed=4))
    assert roles.sync_weights() == 2
    want = todays_rollout(cfg, merged_state(policy.model))
    assert_same_weights(rollout.engine.model, want.engine.model)
    assert_same_samples(rollout, want)


def test_lora_merged_buckets_equal_merged_state(tiny_dir, tmp_path):
    """The benchmark's full-weight LoRA sync (adapters=False) is merged_state, bucketed."""
    cfg = config(tiny_dir, tmp_path, *LORA)
    policy = trained_policy(cfg, tmp_path)
    source = WeightSource(policy.model, bucket_bytes(0.02), adapters=False)
    rollout = RolloutRole(cfg)
    for k in range(len(source.buckets)):
        rollout.sync(source.bucket(k), k == len(source.buckets) - 1)
    assert_same_weights(
        rollout.engine.model, todays_rollout(cfg, merged_state(policy.model)).engine.model
    )


def test_bf16_rollout_copy_with_lora_merges_onto_a_float32_base(tiny_dir, tmp_path):
    cfg = config(tiny_dir, tmp_path, *LORA, "rollout.dtype=bfloat16", "placement.device=cpu")
    policy = trained_policy(cfg, tmp_path)
    rollout = RolloutRole(cfg, device="cpu")
    LocalRoles(policy, rollout, None).sync_weights()
    merged = merged_state(policy.model)
    for name, value in rollout.engine.model.state_dict().items():
        assert value.dtype == torch.bfloat16
        assert torch.equal(value, merged[name].to(torch.bfloat16)), name


def test_a_local_bf16_rollout_merges_onto_the_policy_s_own_base_bit_for_bit(tiny_dir, tmp_path):
    """In one process the rollout merges onto the policy's frozen float32 base itself (no second
    float32 load): the same storage, and the same merged weights as a base of its own."""
    from posttrain.config.build import build_objective
    from posttrain.placement.local import place_local

    cfg = config(tiny_dir, tmp_path, *LORA, "rollout.dtype=bfloat16", "placement.device=cpu")
    roles = place_local(cfg, build_objective, str(tmp_path / "run"))
    own = {p.data_ptr() for p in roles.policy.model.parameters() if not p.requires_grad}
    base = roles.rollout.sink.base
    assert base and {t.data_ptr() for t in base.values()} <= own
    vocab = roles.policy.model.config.vocab_size
    roles.policy.trainer.train_on_batch(synthetic_batch(vocab, 4, seed=4))
    roles.sync_weights()
    alone = RolloutRole(cfg, device="cpu")  # its own float32 load of the base
    LocalRoles(roles.policy, alone, None).sync_weights()
    assert base.keys() == alone.sink.base.keys()
    assert_same_weights(roles.rollout.engine.model, alone.engine.model)


def test_a_sync_that_misses_weights_or_names_unknown_ones_is_refused(tiny_dir, tmp_path):
    cfg = config(tiny_dir, tmp_path)
    rollout = RolloutRole(cfg)
    weight = rollout.engine.model.model.norm.weight
    with pytest.raises(ValueError, match=r"did not arrive \(first: "):
        rollout.sync({"model.norm.weight": weight.clone()}, True)
    with pytest.raises(ValueError, match=r"'module.x' \(3,\) does not fit the engine's model"):
        rollout.sync({"module.x": torch.zeros(3)}, False)
    with pytest.raises(ValueError, match=r"adapters arrived for model.norm"):
        WeightSink(rollout.engine, {}).receive(
            {"model.norm.lora_A": weight, "model.norm.lora_B": weight}, True
        )


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_bad_bucket_size_is_one_line(capsys, value):
    assert (
        main(
            ["config", "show", "--config", "arithmetic", "--", f"placement.sync_bucket_mb={value}"]
        )
        != 0
    )
    err = [x for x in capsys.readouterr().err.strip().splitlines() if x]
    assert len(err) == 1 and "placement.sync_bucket_mb" in err[0], err


def test_wire_form_round_trips_bits_and_views_the_tensors():
    from posttrain.placement.weight_sync import from_wire, to_wire, wire_bytes

    bucket = {"f": torch.randn(3, 4), "h": torch.randn(2, 5).to(torch.bfloat16)}
    wire = to_wire(bucket)
    assert wire["f"].ctypes.data == bucket["f"].data_ptr()  # a view: the store copies once
    for name, t in bucket.items():
        back = from_wire(wire[name])
        assert back.dtype == t.dtype and torch.equal(back, t)
        assert wire_bytes(wire[name]) == wire_bytes(t) == t.numel() * t.element_size()


def test_each_step_reports_what_its_sync_sent(tiny_dir, tmp_path):
    """A rollout with its own bfloat16 copy: every step's record says the bytes, tensors and
    buckets its sync moved (LoRA: the adapters' bytes only, far fewer than the full weights)."""
    import json

    from posttrain.entrypoints import grpo

    def run(name, *extra):
        opts = [f"model.name_or_path={tiny_dir}", f"job.output_root={tmp_path}",
                "placement.sync_bucket_mb=0.02", "rollout.dtype=bfloat16", "rl.max_steps=2",
                "rl.eval_every=0", "logging.progress=false", f"job.name={name}", *extra]  # fmt: skip
        cfg = load_config("arithmetic", ["--", *opts])
        summary = grpo.run(cfg, "arithmetic", opts, grpo.default_out_dir(cfg), build_objective)
        lines = (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x) for x in lines if '"sync/bytes"' in x]

    full, lora = run("full"), run("lora", *LORA)
    assert [r["step"] for r in full] == [1, 2]
    assert full[0]["sync/buckets"] > 1 and full[0]["sync/tensors"] > 0
    assert 0 < lora[0]["sync/bytes"] < full[0]["sync/bytes"] / 10
