"""placement.device, placement.torch_threads_per_process and rollout.dtype on a local run."""

from __future__ import annotations

import pytest
import torch

from posttrain.config import ConfigError, load_config
from posttrain.config.build import build_objective
from posttrain.model.tiny import build_tiny_model
from posttrain.placement.device import (
    bf16_hardware,
    cpu_bf16_flags,
    resolve_device,
    rollout_dtype,
    rollout_dtype_and_why,
)
from posttrain.placement.local import place_local


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model("tiny", tmp_path_factory.mktemp("m") / "tiny", seed=0)


def opts(model, tmp, *extra):
    return [f"model.name_or_path={model}", f"job.output_root={tmp}", *extra]


def test_resolve_device_cpu_and_auto(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_cuda_without_cuda_is_a_one_line_config_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"placement.device=cuda:1 but torch sees no CUDA"):
        resolve_device("cuda:1")


def test_cuda_index_beyond_the_devices(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"placement.device=cuda:3 but only 1 CUDA"):
        resolve_device("cuda:3")
    assert resolve_device("cuda:0") == torch.device("cuda:0")


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:x", "CPU"])
def test_device_spelling_is_checked_at_load(bad):
    with pytest.raises(ConfigError, match="placement.device"):
        load_config("arithmetic", ["--", f"placement.device={bad}"])


def test_rollout_dtype_auto_follows_the_hardware():
    table = {"cpu": "the CPU has avx512_bf16", "cuda": "H100 has bf16"}
    native = lambda device: table[str(device).split(":")[0]]  # noqa: E731
    none = lambda device: None  # noqa: E731
    assert rollout_dtype("auto", torch.device("cpu"), native) == "bfloat16"
    assert rollout_dtype("auto", "cuda:0", native) == "bfloat16"
    assert rollout_dtype("auto", "cpu", none) == "float32"
    assert rollout_dtype("auto", "cuda", none) == "float32"  # a GPU without native bf16
    assert rollout_dtype("float16", "cpu", native) == "float16"
    assert rollout_dtype_and_why("auto", "cpu", native) == (
        "bfloat16",
        "auto: the CPU has avx512_bf16",
    )
    assert rollout_dtype_and_why("auto", "cpu", none)[0] == "float32"
    assert rollout_dtype_and_why("float32", "cpu", native) == ("float32", "")


def test_cpu_bf16_flags_are_read_from_torch_or_proc_cpuinfo():
    assert cpu_bf16_flags({"amx_bf16": True, "avx512_bf16": False}, set()) == ("amx_bf16",)
    assert cpu_bf16_flags({}, {"avx2", "avx512_bf16", "fma"}) == ("avx512_bf16",)
    assert cpu_bf16_flags({"amx_bf16": False}, {"avx2", "avx512f"}) == ()
    both = cpu_bf16_flags({"avx512_bf16": True}, {"amx_bf16"})
    assert both == ("amx_bf16", "avx512_bf16")


def test_this_machines_detection_agrees_with_proc_cpuinfo():
    from pathlib import Path

    info = Path("/proc/cpuinfo")
    if not info.exists():
        pytest.skip("no /proc/cpuinfo")
    flags = set(next(x for x in info.read_text().splitlines() if x.startswith("flags")).split())
    expected = tuple(f for f in ("amx_bf16", "avx512_bf16") if f in flags)
    assert cpu_bf16_flags() == expected
    why = bf16_hardware("cpu")
    assert (why is not None) == bool(expected)
    assert rollout_dtype("auto", "cpu") == ("bfloat16" if expected else "float32")


def test_auto_on_a_bf16_cpu_gives_the_engine_a_bf16_copy_and_says_why(
    tiny_dir, tmp_path, monkeypatch, caplog
):
    import posttrain.placement.device as device

    monkeypatch.setattr(device, "cpu_bf16_flags", lambda: ("avx512_bf16",))
    o = opts(tiny_dir, tmp_path, "rollout.dtype=auto", "placement.device=cpu")
    with caplog.at_level("INFO", logger="posttrain"):
        roles = place_local(load_config("arithmetic", ["--", *o]), build_objective, str(tmp_path))
    assert next(roles.rollout.engine.model.parameters()).dtype == torch.bfloat16
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("placement"))
    assert "rollout on cpu (bfloat16, auto: the CPU has avx512_bf16, own copy)" in line, line


def test_auto_on_a_cpu_without_bf16_shares_the_float32_policy(
    tiny_dir, tmp_path, monkeypatch, caplog
):
    import posttrain.placement.device as device

    monkeypatch.setattr(device, "cpu_bf16_flags", lambda: ())
    o = opts(tiny_dir, tmp_path, "rollout.dtype=auto", "placement.device=cpu")
    with caplog.at_level("INFO", logger="posttrain"):
        roles = place_local(load_config("arithmetic", ["--", *o]), build_objective, str(tmp_path))
    assert roles.rollout.engine.model is roles.policy.model
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("placement"))
    assert "float32, auto: no native bf16 matmuls on this device, shares the policy" in line


def test_tiny_and_smollm2_recipes_pin_float32_sampling():
    """The demos, guides and tests pin float32 outcomes: `auto` would flip them on a bf16 CPU."""
    from posttrain.config.loader import builtin_recipes

    pinned = {n for n in builtin_recipes() if load_config(n).rollout.dtype == "float32"}
    tiny = {"arithmetic", "arithmetic_clipped", "opd_arithmetic", "smollm2_reasoning_gym",
            "smollm2_calculator", "tools_addition", "tools_addition_notool"}  # fmt: skip
    assert tiny <= pinned, tiny - pinned


def test_local_run_sets_threads_and_shares_the_float32_policy(tiny_dir, tmp_path):
    before = torch.get_num_threads()
    try:
        o = opts(tiny_dir, tmp_path, "placement.torch_threads_per_process=2")
        roles = place_local(load_config("arithmetic", ["--", *o]), build_objective, str(tmp_path))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert roles.rollout.engine.model is roles.policy.model
    assert roles.policy.trainer.device == torch.device("cpu")


def test_bf16_rollout_copy_is_refreshed_from_the_master_weights(tiny_dir, tmp_path):
    o = opts(tiny_dir, tmp_path, "rollout.dtype=bfloat16", "placement.device=cpu")
    roles = place_local(load_config("arithmetic", ["--", *o]), build_objective, str(tmp_path))
    engine_model = roles.rollout.engine.model
    assert engine_model is not roles.policy.model
    assert next(engine_model.parameters()).dtype == torch.bfloat16
    assert next(roles.policy.model.parameters()).dtype == torch.float32
    with torch.no_grad():
        for p in roles.policy.model.parameters():
            p.add_(0.01)
    version = roles.sync_weights()
    assert version == 1
    master = roles.policy.model.state_dict()
    for name, value in engine_model.state_dict().items():
        assert torch.equal(value, master[name].to(torch.bfloat16)), name


def test_bf16_rollout_run_publishes_the_sampler_trainer_gap(tiny_dir, tmp_path):
    import json

    from posttrain.entrypoints import grpo

    o = [
        *opts(tiny_dir, tmp_path, "rollout.dtype=bfloat16", "rl.grpo_surrogate=clipped"),
        "data.train_size=40", "data.val_size=4", "data.prompts_per_step=2", "rollout.n=2",
        "rollout.max_tokens=3", "rl.max_steps=2", "rl.save_every=0", "rl.eval_every=0",
        "rl.micro_batch_size=4", "logging.progress=false",
    ]  # fmt: skip
    config = load_config("arithmetic", ["--", *o])
    summary = grpo.run(config, "arithmetic", o, grpo.default_out_dir(config), build_objective)
    rows = [json.loads(x) for x in (tmp_path / "grpo" / "arithmetic_tiny" / "metrics.jsonl")
            .read_text().splitlines()]  # fmt: skip
    assert summary["steps"] == 2
    gaps = [r["train/rollout/logprob_abs_diff"] for r in rows]
    # bf16 sampling weights vs the float32 trainer: a real, small gap
    assert all(0 < g < 0.5 for g in gaps), gaps
