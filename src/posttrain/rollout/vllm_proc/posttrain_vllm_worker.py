"""The vLLM side of ``rollout.engine=vllm``: one process under ``.venv-vllm``'s interpreter.

Started by ``posttrain.rollout.vllm_engine`` as ``python -m posttrain_vllm_worker`` with this
folder as its only ``PYTHONPATH`` entry, so it imports the standard library, vLLM and what
vLLM's environment holds (torch, safetensors), never posttrain or its dependencies (pydantic,
transformers' newer release). It connects back to the driver over
``multiprocessing.connection`` (loopback TCP, an authkey read from stdin) and serves plain
pickled dicts until told to close:

- ``{"op": "generate", "prompts": [[ids]], "params": [{...}], "lora": [name, id, dir] | None}``:
  one request per row (the driver expands ``n`` and picks each row's seed), ``TokensPrompt``
  in, every row with the same adapter or none (vLLM corrupts base rows that share a batch with
  adapter rows); out, per row, the sampled ids, the processed log-prob of each sampled id and
  vLLM's finish reason.
- ``{"op": "reload", "path": dir}``: full weights from the HF-named safetensors files in
  ``dir`` (``reload_weights``), then the two steps vLLM leaves out on the CPU: the tied
  ``lm_head`` is packed again from the new embedding, and the prefix cache is dropped.
- ``{"op": "lora", "lora": [name, id, dir]}``: a new adapter version (a peft folder) becomes
  the only one vLLM holds (a new id each time: vLLM keeps the first adapter it loaded under an
  id, whatever path a later request names), then the prefix cache is dropped.
- ``{"op": "close"}``.

Every reply is ``{"ok": True, ...}`` or ``{"ok": False, "error": one line}``. The first message,
after the model has loaded, is ``{"ok": True, "vllm": version, "max_model_len": ...,
"vocab_size": ..., "tensor_parallel_size": ..., "device_type": ...}``. With tensor-parallel workers on the CPU build,
each worker's OpenMP threads are bound to a share of this process's CPUs
(:func:`cpu_thread_binding`).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Client
from typing import Any


class PosttrainWorkerExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``): the repack step after a reload."""

    def posttrain_repack_lm_head(self) -> int:
        """Pack every ``ParallelLMHead`` again from its current weight.

        On the CPU vLLM packs each GEMM weight (oneDNN / SGL kernels) after loading; a reload
        packs each layer it loaded, but a tied ``lm_head`` loads nothing (its weight is the
        embedding's), so it would keep multiplying by the startup weights. Packing an untied
        head again is harmless (it already holds the new weights)."""
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        model = self.get_model()  # type: ignore[attr-defined]
        count = 0
        for module in model.modules():
            if isinstance(module, ParallelLMHead):
                module.quant_method.process_weights_after_loading(module)
                count += 1
        return count


def _sampling_params(p: dict[str, Any]):
    from vllm import SamplingParams

    return SamplingParams(
        n=1,
        temperature=p["temperature"],
        top_p=p["top_p"],
        max_tokens=p["max_tokens"],
        seed=p["seed"],
        stop_token_ids=list(p["stop_token_ids"]),
        ignore_eos=True,  # the driver's stop ids are the only ones (no tokenizer EOS added)
        logprobs=0,  # the sampled token's log-prob only
        detokenize=False,
        skip_special_tokens=False,
    )


def _lora_request(spec):
    from vllm.lora.request import LoRARequest

    name, lora_id, path = spec
    return LoRARequest(lora_name=name, lora_int_id=int(lora_id), lora_path=path)


def _generate(llm, message: dict[str, Any]) -> dict[str, Any]:
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in message["prompts"]]
    params = [_sampling_params(p) for p in message["params"]]
    lora = message.get("lora")
    request = None if lora is None else _lora_request(lora)
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=request)
    rows = []
    for out in outs:
        c = out.outputs[0]
        ids = [int(t) for t in c.token_ids]
        lps = [float(c.logprobs[i][t].logprob) for i, t in enumerate(ids)]
        rows.append((ids, lps, str(c.finish_reason)))
    return {"ok": True, "rows": rows}


def _reload(llm, message: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    llm.collective_rpc("reload_weights", kwargs={"weights_path": message["path"]})
    packed = llm.collective_rpc("posttrain_repack_lm_head")
    if not llm.reset_prefix_cache():
        return {"ok": False, "error": "vLLM refused to reset its prefix cache after a reload"}
    return {"ok": True, "seconds": time.perf_counter() - start, "lm_heads": packed[0]}


def _lora(llm, message: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    engine = llm.llm_engine
    for old in sorted(engine.list_loras()):
        engine.remove_lora(old)
    if not engine.add_lora(_lora_request(message["lora"])):
        return {"ok": False, "error": f"vLLM refused the adapter in {message['lora'][2]}"}
    if not llm.reset_prefix_cache():
        return {"ok": False, "error": "vLLM refused to reset its prefix cache after an adapter"}
    return {"ok": True, "seconds": time.perf_counter() - start}


def _serve(conn, llm) -> None:
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the driver went away
            return
        op = message.get("op")
        if op == "close":
            conn.send({"ok": True})
            return
        try:
            if op == "generate":
                reply = _generate(llm, message)
            elif op == "reload":
                reply = _reload(llm, message)
            elif op == "lora":
                reply = _lora(llm, message)
            else:
                reply = {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as e:  # noqa: BLE001 - every failure goes back as one line
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(e).__name__}: {' '.join(str(e).split())}"}
        conn.send(reply)


def unsupported_head_size(model_dir: str) -> str | None:
    """Why vLLM's CPU attention cannot run the model in ``model_dir`` (its head size), or None.

    Checked before vLLM starts, because vLLM refuses it inside its engine-core process, where
    the reason reaches the driver only as "Engine core initialization failed"."""
    try:
        from vllm.platforms import current_platform
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:  # another vLLM release: let vLLM itself decide
        return None
    if not current_platform.is_cpu():
        return None
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    head = config.get("head_dim") or (hidden // heads if heads and hidden else None)
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head is None or head in sizes:
        return None
    return (
        f"the model's attention head size is {head}, which vLLM's CPU attention does not take "
        f"(it takes {', '.join(map(str, sizes))}); use such a model or rollout.engine=torch"
    )


def _cpu_build() -> bool:
    """Whether this vLLM samples on the CPU (False where vLLM's platform cannot be read: a
    release without it decides for itself)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return current_platform.is_cpu()


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def numa_nodes(cpus: list[int]) -> int:
    """How many NUMA nodes hold ``cpus`` (1 where sysfs does not say)."""
    nodes = {
        os.path.basename(link)
        for cpu in cpus
        for link in glob.glob(f"/sys/devices/system/cpu/cpu{cpu}/node[0-9]*")
    }
    return max(len(nodes), 1)


def physical_core(cpu: int) -> tuple[str | None, str | None]:
    """(package, core) of a logical CPU: hyperthread siblings share it."""
    topology = f"/sys/devices/system/cpu/cpu{cpu}/topology"
    return _read(f"{topology}/physical_package_id"), _read(f"{topology}/core_id")


def cpu_thread_binding(workers: int, core_of=physical_core, nodes_of=numa_nodes) -> str | None:
    """Why ``workers`` tensor-parallel workers cannot run on vLLM's CPU build here, or None,
    after setting ``VLLM_CPU_OMP_THREADS_BIND`` to one share of this process's cores per worker
    where vLLM's own binding would refuse.

    vLLM's own CPU binding (``auto``) gives each worker a NUMA node of its own and refuses more
    workers than nodes (one node on most machines); then a list per worker (``"0|1"``) binds
    each worker's OpenMP threads to its share instead: one logical CPU per physical core (a
    hyperthread sibling would share its core with the other worker's threads, as vLLM's
    ``auto`` avoids too), in order. A binding the user set is kept, as is vLLM's own where
    there are nodes enough; a GPU build reads none."""
    if workers == 1 or not _cpu_build():
        return None
    if os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if nodes_of(cpus) >= workers:
        return None
    cores: dict[tuple, int] = {}
    for cpu in cpus:  # the first logical CPU of each physical core
        key = core_of(cpu)
        cores.setdefault(key if None not in key else (cpu,), cpu)
    picked = sorted(cores.values())
    if len(picked) < workers:
        return (
            f"vllm.tensor_parallel_size={workers} needs a CPU core per worker on vLLM's CPU "
            f"build and this process may use {len(picked)}; lower it, or set "
            "VLLM_CPU_OMP_THREADS_BIND"
        )
    share, extra = divmod(len(picked), workers)
    lists, start = [], 0
    for w in range(workers):
        end = start + share + (w < extra)
        lists.append(",".join(map(str, picked[start:end])))
        start = end
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(lists)
    return None


def cpu_scheduling(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with chunked prefill off on vLLM's CPU build (a GPU build keeps it).

    When one call's prompts pass vLLM's per-step token budget (4,096 tokens: 64 rows of a
    65-token prompt already do), vLLM prefills a prompt in chunks and, for a request with a seed,
    rewinds its generator after each partial chunk (``gen.set_offset``), which a CPU generator
    does not have: the engine core dies ("CPU Generator does not use offset"). Without chunks
    each prompt is prefilled whole (vLLM then raises its budget to the model length)."""
    return {**options, "enable_chunked_prefill": False} if _cpu_build() else options


def engine_core_in_process() -> None:
    """On vLLM's CPU build, its engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
    unless the environment says otherwise.

    vLLM's default starts the engine core, and a worker under it, as processes of their own, each
    importing vLLM again: measured on a 2-core EPYC, a start of the suite's tiny model took 28 s
    that way and 16 s in one process (``benchmarks/vllm_bench.py``'s ``vllm_load_s``). On the CPU
    the forward and the scheduler share the cores anyway, so the overlap a separate core buys a
    GPU is not there to lose; a GPU build keeps vLLM's default. Tensor-parallel workers are
    still processes of their own."""
    if _cpu_build():
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _device_type() -> str:
    """Where this vLLM build samples ("cpu", "cuda", ...): the driver says so when a GPU run
    would otherwise sample on a CPU build without a word."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def _end_group() -> None:
    """End vLLM's engine-core processes before this one exits. The driver starts this process as
    the leader of a session of its own and vLLM's children join its group; a driver that
    vanished (a Ray actor killed, a SIGKILL) never ends that group, and vLLM's own shutdown at
    exit was seen to leave its engine core running. Only a group this process leads is ended,
    and not this process itself: its exit status and any traceback stay what they were."""
    me = os.getpid()
    if os.getpgid(0) != me:
        return
    for stat in os.listdir("/proc"):
        if not stat.isdigit() or int(stat) == me:
            continue
        try:
            with open(f"/proc/{stat}/stat") as f:
                group = int(f.read().rsplit(")", 1)[1].split()[2])
            if group == me:
                os.kill(int(stat), signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            continue


def main() -> None:
    try:
        _main()
    except BaseException:
        traceback.print_exc()  # the log's last line is what the driver quotes
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        _end_group()


def _main() -> None:
    host, port = os.environ["POSTTRAIN_VLLM_ADDRESS"].rsplit(":", 1)
    authkey = bytes.fromhex(sys.stdin.readline().strip())
    conn = Client((host, int(port)), authkey=authkey)
    options = conn.recv()  # the LLM keywords the driver resolved
    refused = unsupported_head_size(options["model"]) or cpu_thread_binding(
        int(options.get("tensor_parallel_size", 1))
    )
    if refused is not None:
        conn.send({"ok": False, "error": refused})
        return
    engine_core_in_process()
    try:
        from vllm import LLM, __version__

        llm = LLM(
            worker_extension_cls="posttrain_vllm_worker.PosttrainWorkerExtension",
            **cpu_scheduling(options),
        )
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        conn.send({"ok": False, "error": f"{type(e).__name__}: {' '.join(str(e).split())}"})
        return
    model_config = llm.llm_engine.model_config
    conn.send(
        {
            "ok": True,
            "vllm": __version__,
            "max_model_len": int(model_config.max_model_len),
            "vocab_size": int(model_config.get_vocab_size()),
            "tensor_parallel_size": int(
                llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size
            ),
            "device_type": _device_type(),
        }
    )
    _serve(conn, llm)


if __name__ == "__main__":
    main()
