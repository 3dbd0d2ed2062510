"""Shared fixtures: tiny float64 models and synthetic trajectory batches built locally, and one
local Ray instance for every test module that places roles on Ray."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from posttrain.data.trajectory import TrajectoryBatch


def tiny_llama(seed: int = 0, vocab: int = 16, dtype: torch.dtype = torch.float64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(cfg).to(dtype)


def random_batch(
    seed: int = 0,
    b: int = 6,
    p: int = 3,
    r: int = 5,
    vocab: int = 16,
    group_size: int = 2,
    per_token_adv: bool = False,
) -> TrajectoryBatch:
    """Left-padded prompts, right-padded responses of random lengths (some rows may be empty)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, p + r), generator=g)
    attn = torch.ones(b, p + r, dtype=torch.long)
    prompt_len = torch.randint(1, p + 1, (b,), generator=g)
    resp_len = torch.randint(0, r + 1, (b,), generator=g)
    resp_mask = torch.arange(r).unsqueeze(0) < resp_len.unsqueeze(1)
    for i in range(b):
        attn[i, : p - prompt_len[i]] = 0
        ids[i, : p - prompt_len[i]] = 0
        attn[i, p + resp_len[i] :] = 0
        ids[i, p + resp_len[i] :] = 0
    adv_shape = (b, r) if per_token_adv else (b,)
    return TrajectoryBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp_mask,
        group_ids=torch.arange(b, dtype=torch.long) // group_size,
        sample_ids=torch.arange(b, dtype=torch.long),
        advantages=torch.randn(adv_shape, generator=g, dtype=torch.float64),
    )


@pytest.fixture
def model():
    return tiny_llama()


@pytest.fixture(autouse=True, scope="session")
def _vllm_cache(tmp_path_factory):
    """vLLM's cache (the engine's process inherits ``VLLM_CACHE_ROOT``) in the session's tmp
    folder, not the user's ``~/.cache/vllm``: shared by every engine a test process starts, as a
    user's runs share theirs, so only the first start inspects the model class. Set before Ray
    starts, so Ray's workers (and the engines they start) inherit it too."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm-cache")))
        yield


RAY_CPUS = 2  # the capacity checks' messages in the Ray tests count on exactly this many


def pytest_collection_modifyitems(config, items):
    """The modules with a test on the shared Ray instance (:func:`ray_cluster`) run together, so
    the instance starts once: in one process last, after every other test (none runs beside
    Ray's daemons); under pytest-xdist first, as the longest unit (see below)."""
    ray_files = {i.path for i in items if "ray_cluster" in getattr(i, "fixturenames", ())}
    on_ray = [i for i in items if i.path in ray_files]
    rest = [i for i in items if i.path not in ray_files]
    items[:] = on_ray + rest if os.environ.get("PYTEST_XDIST_WORKER") else rest + on_ray


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (``make test``: ``-n 2 --dist loadfile``), with every file that uses
    :func:`ray_cluster` in one unit: one worker runs them all, one after another, on one Ray
    instance, while the other worker takes the remaining files (each file's module fixtures are
    built once). The Ray unit goes first, in collection order: it is the longest."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    here = Path(__file__).parent
    ray_files = {
        str(p.relative_to(config.rootpath))
        for p in here.glob("test_*.py")
        if "ray_cluster" in p.read_text()
    }

    class FilesAndRay(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "ray" if path in ray_files else path

    config.option.loadscopereorder = False
    vllm_files = _vllm_files(here, config.rootpath)

    class FilesRayAndVllm(FilesAndRay):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "vllm" if path in vllm_files else super()._split_scope(nodeid)

    return FilesRayAndVllm(config, log)


#: The line a test file carries when it starts vLLM engines (rollout.engine=vllm).
VLLM_UNIT = "# xdist: vllm unit"


def _vllm_files(here: Path, root: Path) -> set[str]:
    """The files that start vLLM engines run as one unit on one worker, one after another: two
    vLLM processes at once would each bind the machine's cores and reserve their KV space, and
    each file shares one engine among its tests (a start costs ~9-17 s)."""
    return {str(p.relative_to(root)) for p in here.glob("test_*.py") if VLLM_UNIT in p.read_text()}


@pytest.fixture(scope="session")
def _ray_instance():
    ray = pytest.importorskip("ray")
    # Ray's workers inherit this from the raylet: a vLLM engine a Ray test starts (the rollout
    # actor's) leaves its threads unbound, so it cannot pin the cores the vLLM unit's engine
    # (on the other xdist worker) binds at the same time (two bound engines hung a start).
    saved = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    try:
        ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=True)
    finally:
        if saved is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = saved
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_cluster(_ray_instance):
    """The session's local Ray instance (its GCS address, for CLI drivers that join it), idle.

    Starting Ray costs seconds on 2 cores; a placement attaches to an instance this process
    already runs (``posttrain.placement.ray``) and leaves it running. Each module starts once
    the actors of the modules before it (killed ranks, killed drivers' jobs) have given their
    CPUs back, so it sees the whole instance as a fresh one would."""
    import ray

    deadline = time.monotonic() + 60
    while ray.available_resources().get("CPU", 0.0) < RAY_CPUS:
        assert time.monotonic() < deadline, (
            f"the shared Ray instance still holds CPUs of an earlier module's actors: "
            f"{ray.available_resources()}"
        )
        time.sleep(0.1)
    return _ray_instance
