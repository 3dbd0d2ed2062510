"""Preflight of control/vllm.py and the vLLM engine's errors that need no vLLM: each refusal is
one line, the missing environment names ``make install-vllm``, a vLLM process that dies at start
is one line naming the engine, and the install's requirement filter."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "scripts"))
from preflight_cases import OPD, Case, cfg, check_case, covered  # noqa: E402

from posttrain.config.serialize import from_yaml, to_yaml  # noqa: E402
from posttrain.control import PreflightError, run_preflight, vllm  # noqa: E402
from posttrain.placement.errors import RoleFailedError  # noqa: E402
from posttrain.rollout import vllm_process  # noqa: E402

VLLM = ["rollout.engine=vllm"]
LORA = ["model.lora_rank=8"]
ADAPTER = ["vllm.lora_sync=adapter"]
#: The tiny preset's shape (4 heads), with no folder whose config.json would decide instead.
TINY = ["model.name_or_path=/nonexistent/tiny", "model.init_preset=tiny"]


def _model_folder(heads: int, kv_heads: int) -> Path:
    """A folder whose config.json is all preflight reads of a model's shape."""
    folder = Path(tempfile.mkdtemp(prefix="posttrain-shape-"))
    shape = {"vocab_size": 64, "hidden_size": 64 * heads, "num_hidden_layers": 1,
             "num_attention_heads": heads, "num_key_value_heads": kv_heads,
             "intermediate_size": 64}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(shape))
    atexit.register(shutil.rmtree, folder, True)
    return folder


RAY_GPU = ["placement.backend=ray", "placement.gpus_per_role=1"]
#: 12 attention heads, 6 key/value heads: 4 workers split the heads but not the KV heads.
SMALL_KV = [f"model.name_or_path={_model_folder(12, 6)}"]
REPO = Path(__file__).resolve().parents[1]

CASES: list[Case] = [
    ("vllm_section_needs_the_engine", ["vllm.kv_cache_space_gib=4.0"],
     "vllm.kv_cache_space_gib=4.0 is read only with rollout.engine=vllm (got rollout.engine=torch)",
     [*VLLM, "vllm.kv_cache_space_gib=4.0"]),
    ("vllm_without_is_correction", [*VLLM, "rl.rollout_is_cap=0"],
     "rl.rollout_is_cap=0 with rollout.engine=vllm", VLLM),
    ("vllm_lora_sync_needs_lora", [*VLLM, *ADAPTER],
     "vllm.lora_sync=adapter is read only with a LoRA policy (got model.lora_rank=0); set "
     "model.lora_rank or remove vllm.lora_sync", [*VLLM, *LORA, *ADAPTER]),
    ("vllm_lora_rank_fits", [*VLLM, "model.lora_rank=1024", *ADAPTER],
     "model.lora_rank=1024 with vllm.lora_sync=adapter: vLLM's LoRA path takes ranks up to 512; "
     "use vllm.lora_sync=merged", [*VLLM, "model.lora_rank=1024"]),
    ("vllm_lora_runs_eager", [*VLLM, *LORA, *ADAPTER, "vllm.enforce_eager=false"],
     "vllm.enforce_eager=false with vllm.lora_sync=adapter: vLLM's CPU build runs a model with "
     "LoRA enabled eager", [*VLLM, *LORA, "vllm.enforce_eager=false"]),
    ("vllm_heads_split_evenly", [*VLLM, *TINY, "vllm.tensor_parallel_size=3"],
     "vllm.tensor_parallel_size=3: the model has 4 attention heads, which vLLM cannot share out "
     "evenly over 3 workers; use a divisor of 4", [*VLLM, *TINY, "vllm.tensor_parallel_size=2"]),
    ("vllm_workers_have_gpus", [*VLLM, *RAY_GPU, "vllm.tensor_parallel_size=2"],
     "vllm.tensor_parallel_size=2 with placement.gpus_per_role=1: the rollout actor would see 1 "
     "GPU(s) for 2 vLLM workers", [*VLLM, *RAY_GPU, "placement.gpus_per_role=2",
                                   "vllm.tensor_parallel_size=2"]),
    ("vllm_heads_split_evenly", [*VLLM, *SMALL_KV, "vllm.tensor_parallel_size=4"],
     "vllm.tensor_parallel_size=4: the model has 6 key/value heads, which vLLM can neither share "
     "out over 4 workers nor copy to each; use a divisor or a multiple of 6",
     [*VLLM, *SMALL_KV, "vllm.tensor_parallel_size=3"]),
]  # fmt: skip


@pytest.fixture
def vllm_env(monkeypatch, tmp_path):
    """An interpreter path that exists (a file), so the environment rule is satisfied here."""
    python = tmp_path / "python"
    python.write_text("")
    monkeypatch.setenv(vllm_process.PYTHON_ENV, str(python))
    return python


def test_every_rule_of_the_module_has_a_case():
    assert covered([*CASES, ("vllm_environment_exists", [], "", [])], vllm)


@pytest.mark.parametrize(("name", "bad", "fragment", "good"), CASES)
def test_rule_failing_and_passing_side(vllm_env, name, bad, fragment, good):
    check_case(name, bad, fragment, good)


@pytest.mark.parametrize(
    ("opts", "cap"),
    [
        (VLLM, 2.0),  # the default with this engine: the correction is on
        ([*VLLM, "rl.rollout_is_cap=0"], 0.0),  # a value the user sets is kept
        ([*VLLM, "rl.rollout_is_cap=3.5"], 3.5),
        (["rollout.engine=vllm", "rollout.engine=torch"], 0.0),  # the last engine decides
        ([], 0.0),
    ],
)
def test_the_is_cap_defaults_on_with_vllm_and_a_set_value_is_kept(vllm_env, opts, cap):
    config = cfg(opts)
    assert config.rl.rollout_is_cap == cap
    assert from_yaml(to_yaml(config)).rl.rollout_is_cap == cap  # the saved run record agrees
    warned = any("rl.rollout_is_cap=0 with rollout.engine=vllm" in w for w in run_preflight(config))
    assert warned == (config.rollout.engine == "vllm" and cap == 0)  # only a cap turned off


def test_the_vllm_default_cap_is_no_claim_for_an_objective_that_reads_none(vllm_env):
    """legacy_pg reads no cap: an explicit one is refused as never read, vLLM's default is not."""
    legacy = [*VLLM, "rl.grpo_surrogate=legacy_pg", "rl.kl_beta=0"]
    run_preflight(cfg(legacy))
    with pytest.raises(PreflightError, match=r"rl.rollout_is_cap=3.5 .*never read"):
        run_preflight(cfg([*legacy, "rl.rollout_is_cap=3.5"]))


def test_without_the_environment_the_run_is_one_line_naming_the_install(monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_process.PYTHON_ENV, str(tmp_path / "missing" / "python"))
    with pytest.raises(PreflightError) as info:
        run_preflight(cfg(VLLM))
    text = str(info.value)
    assert "\n" not in text and "rollout.engine=vllm needs vLLM's own environment" in text
    assert "`make install-vllm`" in text
    assert run_preflight(cfg([])) == []  # the torch engine does not need it


def test_environments_opd_ray_and_a_lag_compose_with_the_engine(vllm_env):
    """vLLM declares multi-turn and serves OPD (tests/test_vllm_engine.py runs both) and a Ray
    rollout actor under a lag (tests/test_vllm_ray.py); an engine
    that does not declare multi-turn is still refused, with vLLM among the engines named."""
    assert run_preflight(cfg([*VLLM, "env.name=calculator"])) == []
    assert run_preflight(cfg([*VLLM, *OPD])) == []
    assert run_preflight(cfg([*VLLM, "placement.backend=ray", "rl.off_policy_lag=1"])) == []
    with pytest.raises(
        PreflightError, match=r"env.name=calculator needs rollout.engine=torch\|vllm"
    ):
        run_preflight(cfg(["rollout.engine=static", "env.name=calculator"]))


def test_a_policy_only_entry_refuses_the_vllm_section():
    dpo = ["job.algorithm=dpo", "dpo.pairs_path=p", "vllm.enforce_eager=false"]
    with pytest.raises(PreflightError, match=r"vllm.enforce_eager=False .*never read"):
        run_preflight(cfg(dpo))


def test_a_vllm_process_that_dies_at_start_is_one_line_naming_the_engine(monkeypatch, tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'ImportError: no vllm here' >&2\nexit 3\n")
    python.chmod(0o755)
    monkeypatch.setenv(vllm_process.PYTHON_ENV, str(python))
    workdir = tmp_path / "work"
    workdir.mkdir()
    with pytest.raises(RoleFailedError) as info:
        vllm_process.VllmProcess({}, {}, str(workdir))
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(
        "rollout.engine=vllm: the vLLM process exited with status 3 during start"
    )
    assert "(last line: ImportError: no vllm here)" in text


def _proc_module(name: str):
    """A module of vLLM's side (``rollout/vllm_proc``), imported here without vLLM."""
    path = REPO / "src/posttrain/rollout/vllm_proc" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("cpus", "workers", "bind"),
    [([0, 1], 2, "0|1"), ([4, 5, 6], 2, "4,5|6"), ([0, 1, 2, 3], 2, "0,1|2,3"), ([0, 1], 1, None)],
)
def test_tensor_parallel_workers_on_the_cpu_build_share_the_cpus_in_order(
    monkeypatch, cpus, workers, bind
):
    """vLLM's own CPU binding wants a NUMA node per worker; the worker binds a share of its
    CPUs per worker instead (what let ``vllm.tensor_parallel_size=2`` start on this 2-core,
    1-node machine), and keeps a binding the user set."""
    _fake_vllm_platform(monkeypatch, cpu=True)
    worker = _proc_module("posttrain_vllm_worker")
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid: set(cpus))
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    one_node = {"core_of": lambda cpu: ("0", str(cpu)), "nodes_of": lambda cpus: 1}
    assert worker.cpu_thread_binding(workers, **one_node) is None
    assert worker.os.environ.get("VLLM_CPU_OMP_THREADS_BIND") == bind
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1|2-3")
    assert worker.cpu_thread_binding(workers, **one_node) is None
    assert worker.os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0-1|2-3"


def test_tensor_parallel_binding_takes_one_cpu_per_core_and_leaves_numa_to_vllm(monkeypatch):
    """Hyperthread siblings (CPUs 0-3 and 4-7 on cores 0-3) are not shared out as if they were
    cores; with a NUMA node per worker vLLM's own binding stays."""
    _fake_vllm_platform(monkeypatch, cpu=True)
    worker = _proc_module("posttrain_vllm_worker")
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    siblings = {"core_of": lambda cpu: ("0", str(cpu % 4)), "nodes_of": lambda cpus: 1}
    assert worker.cpu_thread_binding(2, **siblings) is None
    assert worker.os.environ["VLLM_CPU_OMP_THREADS_BIND"] == "0,1|2,3"
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    assert worker.cpu_thread_binding(2, core_of=siblings["core_of"], nodes_of=lambda c: 2) is None
    assert "VLLM_CPU_OMP_THREADS_BIND" not in worker.os.environ


def test_more_tensor_parallel_workers_than_cpus_is_one_line_and_a_gpu_build_binds_nothing(
    monkeypatch,
):
    worker = _proc_module("posttrain_vllm_worker")
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    _fake_vllm_platform(monkeypatch, cpu=True)
    assert worker.cpu_thread_binding(4, nodes_of=lambda cpus: 1) == (
        "vllm.tensor_parallel_size=4 needs a CPU core per worker on vLLM's CPU build and this "
        "process may use 2; lower it, or set VLLM_CPU_OMP_THREADS_BIND"
    )
    _fake_vllm_platform(monkeypatch, cpu=False)
    assert worker.cpu_thread_binding(4) is None
    assert "VLLM_CPU_OMP_THREADS_BIND" not in worker.os.environ


def _fake_vllm_platform(monkeypatch, cpu: bool) -> None:
    platform = type("Platform", (), {"is_cpu": staticmethod(lambda: cpu)})()
    vllm = type(sys)("vllm")
    platforms = type(sys)("vllm.platforms")
    platforms.current_platform = platform
    vllm.platforms = platforms
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)


def test_the_install_keeps_every_requirement_but_the_cuda_media_wheels():
    module = _proc_module("vllm_requirements")
    declared = [
        "regex", "transformers<5.20.0,>=5.16.1", 'torch==2.13.0+cpu; platform_machine == "x86_64"',
        'torchaudio; platform_machine != "s390x"', "torchvision; platform_machine != 'riscv64'",
        "torchcodec>=0.14", 'pandas; extra == "bench"', "mistral_common[image]>=1.11.6",
    ]  # fmt: skip
    assert module.kept_requirements(declared) == [
        "regex", "transformers<5.20.0,>=5.16.1", 'torch==2.13.0+cpu; platform_machine == "x86_64"',
        "mistral_common[image]>=1.11.6",
    ]  # fmt: skip


def test_a_lora_policy_sends_adapters_except_to_vllm_asked_for_merged_weights(vllm_env):
    from posttrain.placement.roles import sends_adapters

    assert sends_adapters(cfg(LORA))  # the torch engine merges them onto its base copy
    assert not sends_adapters(cfg([*VLLM, *LORA]))  # merged full weights, the default
    assert sends_adapters(cfg([*VLLM, *LORA, *ADAPTER]))  # vLLM's LoRA path


def test_every_knob_of_the_vllm_section_reaches_vllm(vllm_env, monkeypatch, tmp_path):
    """Each field of the ``vllm`` section, set away from its default, arrives in the engine's
    options under its own name (``lora_sync`` decides the adapter fields instead), and from there
    in the keywords vLLM's ``LLM`` is built with (captured in place of the process; the CPU build
    shows no effect of ``gpu_memory_utilization``, so only this would catch it dropped)."""
    from posttrain.config.vllm import VllmConfig
    from posttrain.placement.device import rollout_dtype
    from posttrain.placement.roles import vllm_options

    changed = {"kv_cache_space_gib": 3.5, "max_model_len": 96, "enforce_eager": False,
               "enable_prefix_caching": False, "tensor_parallel_size": 2,
               "gpu_memory_utilization": 0.6}  # fmt: skip
    assert set(changed) == set(VllmConfig.model_fields) - {"lora_sync"}
    options = vllm_options(cfg([*VLLM, *(f"vllm.{k}={v}" for k, v in changed.items())]), "cpu")
    assert {k: getattr(options, k) for k in changed} == changed
    # rollout.dtype=auto: the machine decides (bfloat16 where the CPU has native bf16 matmuls)
    auto = rollout_dtype("auto", "cpu")
    assert options.dtype == auto and options.lora_rank == 0
    adapters = vllm_options(cfg([*VLLM, *LORA, *ADAPTER]), "cpu")
    assert (adapters.lora_rank, options.lora_rank) == (8, 0)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrain.rollout import vllm_engine

    sent: dict = {}

    class Captured:
        def __init__(self, llm, env, workdir):
            sent.update(llm)
            self.workdir = workdir
            self.ready = {"max_model_len": 96, "vocab_size": 64, "tensor_parallel_size": 2}

        def close(self):
            shutil.rmtree(self.workdir)

    monkeypatch.setattr(vllm_engine, "VllmProcess", Captured)
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=64,
                                                eos_token_id=2))  # fmt: skip
    engine = vllm_engine.VllmRolloutEngine(skeleton, weights_from=tmp_path, options=options)
    vllm_names = {"kv_cache_space_gib": ("kv_cache_memory_bytes", int(3.5 * 2**30))}
    for key, value in changed.items():
        name, expected = vllm_names.get(key, (key, value))
        assert sent[name] == expected, key
    assert sent["dtype"] == auto and "enable_lora" not in sent
    pinned = vllm_options(cfg([*VLLM, "rollout.dtype=float32"]), "cpu")
    assert pinned.dtype == "float32"
    engine.close()


def test_the_cpu_build_prefills_prompts_whole_and_a_gpu_build_keeps_chunks(monkeypatch):
    """vLLM's CPU build cannot rewind a seeded request's generator after a partial prefill
    (tests/test_vllm_engine.py shows the call that died), so the worker turns chunked prefill
    off there, and only there."""
    worker = _proc_module("posttrain_vllm_worker")
    _fake_vllm_platform(monkeypatch, cpu=True)
    assert worker.cpu_scheduling({"model": "m"}) == {"model": "m", "enable_chunked_prefill": False}
    _fake_vllm_platform(monkeypatch, cpu=False)
    assert worker.cpu_scheduling({"model": "m"}) == {"model": "m"}


def test_the_cpu_build_runs_its_engine_core_in_process_unless_the_environment_says(monkeypatch):
    """vLLM's CPU build starts without its engine-core and worker processes (each imports vLLM
    again: 28 s against 16 s a start, vllm_bench's vllm_load_s); a GPU build keeps vLLM's
    default, and a value the user set stays."""
    worker = _proc_module("posttrain_vllm_worker")
    key = "VLLM_ENABLE_V1_MULTIPROCESSING"
    for cpu, preset, expected in [(True, None, "0"), (False, None, None), (True, "1", "1")]:
        _fake_vllm_platform(monkeypatch, cpu=cpu)
        if preset is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, preset)
        worker.engine_core_in_process()
        assert os.environ.get(key) == expected, (cpu, preset)


@pytest.mark.parametrize(
    ("device", "workers", "visible", "count", "expected"),
    [
        ("cpu", 2, None, 0, None),
        ("cuda", 1, None, 4, "0"),
        ("cuda:1", 2, None, 4, "1,2"),
        ("cuda", 2, "3,5,7", 8, "3,5"),  # the GPUs Ray gave the actor, as the machine names them
        ("cuda:1", 1, "3,5", 8, "5"),
    ],
)
def test_vllm_takes_its_gpus_from_the_runs_device_on(device, workers, visible, count, expected):
    from posttrain.rollout.vllm_engine import cuda_devices

    assert cuda_devices(device, workers, visible, count) == expected


def test_more_gpus_than_the_rollout_sees_is_one_line():
    from posttrain.rollout.vllm_engine import cuda_devices

    with pytest.raises(ValueError) as info:
        cuda_devices("cuda:1", 2, "3,5", 8)
    assert str(info.value) == (
        "rollout.engine=vllm: vllm.tensor_parallel_size=2 from cuda:1 needs GPUs 1..2, and this "
        "process sees 2; lower it, or give the rollout more GPUs (placement.gpus_per_role under "
        "Ray)"
    )


def test_a_gpu_run_with_a_cpu_build_of_vllm_is_one_line(monkeypatch, tmp_path):
    """On a GPU machine ``.venv-vllm`` (the CPU build) would sample on the CPU without a word."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrain.rollout import vllm_engine

    closed = []

    class CpuBuild:
        def __init__(self, llm, env, workdir):
            self.workdir = workdir
            self.ready = {"max_model_len": 96, "vocab_size": 64, "tensor_parallel_size": 1,
                          "device_type": "cpu"}  # fmt: skip

        def close(self):
            closed.append(True)
            shutil.rmtree(self.workdir)

    monkeypatch.setattr(vllm_engine, "VllmProcess", CpuBuild)
    monkeypatch.setattr(vllm_engine, "cuda_devices", lambda *a: "0")  # no GPU here
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=64,
                                                eos_token_id=2))  # fmt: skip
    options = vllm_engine.VllmOptions(device="cuda")
    with pytest.raises(RoleFailedError) as info:
        vllm_engine.VllmRolloutEngine(skeleton, weights_from=tmp_path, options=options)
    assert str(info.value) == (
        "rollout.engine=vllm: the run samples on cuda, but vLLM's interpreter is a CPU build (it "
        "would sample on the CPU); point $POSTTRAIN_VLLM_PYTHON at a GPU build of vLLM"
    )
    assert closed == [True]
