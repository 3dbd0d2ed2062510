"""Will it fit? Peak memory per role, estimated from the resolved config before a run.

The model's shape comes from its ``config.json`` (or a tiny preset's dimensions); no weights
are loaded. The parts are those ``benchmarks/memory_profile.py`` measures:

- weights: float32 master parameters (LoRA adapters included); a frozen reference without LoRA
  and a rollout copy in another dtype add their own;
- gradients and optimizer state: 4 and 8 (AdamW) bytes per trainable parameter;
- activations: what autograd keeps for one micro-batch's backward, per layer and token
  (coefficients below, counted per saved tensor of a Llama-family layer with sdpa attention;
  1,843 MB against the 1,852 MB profiled for the SmolLM2 recipe's 16-row micro-batch);
  under a shared prefix each group's prompt counts once on the query side; under gradient
  checkpointing each layer keeps its input and one layer is recomputed at a time;
- logits: one chunk of float32 logits and its gradient (the head runs per chunk above
  ``LOGIT_CHUNK_ELEMENTS``);
- temporaries and heap: a measured multiple of the activations (``UPDATE_SLACK``);
- rollout KV cache: keys and values of every layer for rows x (prompt + max_tokens);
- runtime: the process before the model (Python, torch, transformers), measured here.

Micro-batches are sized by ``rl.micro_batch_tokens`` when set (the trainer keeps to it, but for
a single row longer than the budget), else
``rl.micro_batch_size`` rows of the longest prompt plus ``rollout.max_tokens``.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from posttrain.config import PosttrainConfig
from posttrain.config.build import reference_on_data
from posttrain.placement.device import rollout_dtype as resolve_rollout_dtype

MB = 1e6
#: The process before the model loads (Python, torch, transformers, posttrain), CPU, measured.
RUNTIME_BYTES = 360 * MB
#: float32 values autograd keeps per query-side token and layer, as multiples of
#: hidden (norm inputs/outputs, residuals), attention width and MLP width; and per key-side
#: token (keys, values, their rotated and repeated copies).
Q_HIDDEN, Q_ATTENTION, Q_MLP = 4, 3, 4
KV_KEY, KV_ATTENTION = 3, 2
#: Logit elements per chunk of the chunked head (data/logprobs.py LOGIT_CHUNK_ELEMENTS) and of
#: the log-softmax temporaries (CHUNK_ELEMENTS); copied so this module imports no torch.
LOGIT_CHUNK_ELEMENTS = 1 << 26
#: What an update's peak holds beyond its saved activations and logits (forward temporaries,
#: gradients in flight, heap fragmentation), as a multiple of the activations: 1.24 and 1.37
#: in the two SmolLM2 profiles of docs/guides/performance.md (16 and 4 rows a micro-batch).
UPDATE_SLACK = 1.25
SOFTMAX_CHUNK_ELEMENTS = 1 << 24
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Llama-family decoder that memory depends on."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool

    @classmethod
    def from_config(cls, c: dict) -> ModelShape:
        heads = c["num_attention_heads"]
        return cls(
            vocab=c["vocab_size"],
            hidden=c["hidden_size"],
            layers=c["num_hidden_layers"],
            heads=heads,
            kv_heads=c.get("num_key_value_heads") or heads,
            head_dim=c.get("head_dim") or c["hidden_size"] // heads,
            intermediate=c["intermediate_size"],
            tied=bool(c.get("tie_word_embeddings", False)),
        )

    @property
    def attention(self) -> int:
        return self.heads * self.head_dim

    @property
    def key(self) -> int:
        return self.kv_heads * self.head_dim

    def linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each decoder layer's linear layers, by module name."""
        h, a, k, i = self.hidden, self.attention, self.key, self.intermediate
        return {"q_proj": (h, a), "k_proj": (h, k), "v_proj": (h, k), "o_proj": (a, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}  # fmt: skip

    def parameters(self) -> int:
        layer = sum(i * o for i, o in self.linears().values()) + 2 * self.hidden
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        return embed + self.layers * layer + self.hidden

    def lora_parameters(self, rank: int, targets: list[str]) -> int:
        per_layer = sum(rank * (i + o) for n, (i, o) in self.linears().items() if n in targets)
        return self.layers * per_layer


def model_shape(cfg: PosttrainConfig) -> ModelShape | None:
    """The policy's shape from its folder's config.json, else its tiny preset (None if neither)."""
    path = Path(cfg.model.name_or_path) / "config.json"
    if path.is_file():
        return ModelShape.from_config(json.loads(path.read_text()))
    if cfg.model.init_preset:
        from posttrain.model.presets import preset_config

        return ModelShape.from_config(preset_config(cfg.model.init_preset))
    return None


#: When a part is resident: ``held`` for the whole run, else only during that phase.
PHASES = ("held", "load", "rollout", "update")


@dataclass(frozen=True)
class Part:
    role: str
    name: str
    bytes: float
    phase: str = "held"


def estimate(
    cfg: PosttrainConfig, shape: ModelShape, prompt_tokens: int, device: str = "cpu"
) -> list[Part]:
    """The parts of peak memory, by role, for ``cfg`` on ``device`` (``cpu`` or ``cuda``).

    ``prompt_tokens``: the longest prompt of a step. Local placement holds every role in one
    process: what is held all run, plus the largest phase (loading, rollout, update), since
    freed memory leaves the process between phases (``placement/heap.py``).
    """
    m, rl, ro = cfg.model, cfg.rl, cfg.rollout
    params = shape.parameters()
    lora = shape.lora_parameters(m.lora_rank, list(m.lora_target_modules)) if m.lora_rank else 0
    trainable = lora or params
    parts = [
        Part("process", "runtime (Python, torch, transformers)", RUNTIME_BYTES),
        Part("policy", "weights (float32 master)", 4 * (params + lora)),
        Part("policy", "gradients", 4 * trainable),
        Part("policy", "optimizer state", 8 * trainable if rl.optimizer == "adamw" else 0),
        Part("policy", "weight file mapped while loading", 4 * params, "load"),
    ]
    parts += _activations(cfg, shape, prompt_tokens)
    if rl.kl_beta > 0 and reference_on_data(cfg):  # a role of its own: LoRA's base loads too
        dtype = "float32" if m.lora_rank else m.dtype
        parts.append(Part("reference", "weights (data side)", _DTYPE_BYTES[dtype] * params))
    elif rl.kl_beta > 0 and not m.lora_rank:
        parts.append(Part("reference", "weights", _DTYPE_BYTES[m.dtype] * params))
    rollout_dtype = resolve_rollout_dtype(ro.dtype, device)
    if rollout_dtype != "float32":
        parts.append(Part("rollout", f"weights ({rollout_dtype} copy)",
                          _DTYPE_BYTES[rollout_dtype] * params))  # fmt: skip
    rows = cfg.data.prompts_per_step * ro.n
    context = prompt_tokens + ro.max_tokens
    kv = 2 * shape.layers * rows * context * shape.key * _DTYPE_BYTES[rollout_dtype]
    parts.append(Part("rollout", f"KV cache ({rows} rows x {context} tokens)", kv, "rollout"))
    parts.append(Part("rollout", "sampling logits", 3 * rows * shape.vocab * 4, "rollout"))
    return parts


def micro_batch(cfg: PosttrainConfig, prompt_tokens: int) -> tuple[int, int]:
    """(rows, tokens) of the largest update micro-batch: the token budget's when set."""
    width = prompt_tokens + cfg.rollout.max_tokens
    rows = min(cfg.rl.micro_batch_size, cfg.data.prompts_per_step * cfg.rollout.n)
    budget = cfg.rl.micro_batch_tokens
    if budget is not None:
        rows = max(1, budget // width)
    return rows, rows * width


def _activations(cfg: PosttrainConfig, s: ModelShape, prompt_tokens: int) -> list[Part]:
    rows, tokens = micro_batch(cfg, prompt_tokens)
    response = cfg.rollout.max_tokens
    # A sharded policy encodes each row's prompt and runs its own head over every response
    # position (its forward gathers the head: data/prefix.py, data/logprobs.py).
    sharded = cfg.placement.policy_sharding == "fsdp"
    shared = cfg.rl.shared_prefix != "off" and not cfg.model.gradient_checkpointing and not sharded
    groups = -(-rows // cfg.rollout.n)
    query = rows * response + groups * prompt_tokens if shared else tokens
    per_q = Q_HIDDEN * s.hidden + Q_ATTENTION * s.attention + Q_MLP * s.intermediate
    per_kv = KV_KEY * s.key + KV_ATTENTION * s.attention
    layer = 4 * (query * per_q + tokens * per_kv)
    if cfg.model.gradient_checkpointing:
        kept = 4 * s.layers * tokens * s.hidden + layer  # layer inputs + one recomputed layer
        what = "activations (checkpointed layers)"
    else:
        kept, what = s.layers * layer, "activations"
    chunk = max(1, LOGIT_CHUNK_ELEMENTS // max(1, response * s.vocab))
    logit_rows = rows if sharded else min(rows, chunk)
    elements = logit_rows * response * s.vocab
    logits = 2 * 4 * elements + 3 * 4 * min(elements, SOFTMAX_CHUNK_ELEMENTS)
    return [
        Part("policy", f"{what} ({rows} rows, {tokens} tokens)", kept, "update"),
        Part(
            "policy",
            f"temporaries and heap ({UPDATE_SLACK} x activations, measured)",
            UPDATE_SLACK * kept,
            "update",
        ),  # fmt: skip
        Part(
            "policy",
            f"logits ({logit_rows} rows x {response} x {s.vocab}, with gradient)",
            logits,
            "update",
        ),  # fmt: skip
    ]


def peak(parts: list[Part]) -> float:
    """What is held all run plus the largest phase."""
    phase = {ph: sum(p.bytes for p in parts if p.phase == ph) for ph in PHASES}
    return phase.pop("held") + max(phase.values())


def prompt_tokens(cfg: PosttrainConfig) -> int:
    """The longest prompt among the first steps' train prompts, as the run renders them
    (characters + 2 where the tokenizer is not built yet: the tiny presets are character-level)."""
    from posttrain.control.data_checks import load_tasks
    from posttrain.data.tasks.prompts import format_prompt

    tasks = load_tasks(cfg)
    items, _ = tasks.take(cfg.job.seed, 0, min(len(tasks), 4 * cfg.data.prompts_per_step))
    folder = Path(cfg.model.tokenizer_path or cfg.model.name_or_path)
    if not (folder / "tokenizer_config.json").is_file():
        return max(len(format_prompt(it, "plain", None, user_template=cfg.data.user_template))
                   for it in items) + 2  # fmt: skip
    from posttrain.model.tokenizer import load_tokenizer
    from posttrain.run.records import encode_prompts

    return max(len(p) for p in encode_prompts(items, cfg.data, load_tokenizer(folder)))


def device_kind(cfg: PosttrainConfig) -> str:
    """``cuda`` or ``cpu``: where ``placement.device`` puts the roles (Ray: a GPU per role)."""
    if cfg.placement.backend == "ray":
        return "cuda" if cfg.placement.gpus_per_role else "cpu"
    spec = cfg.placement.device
    if spec == "auto":
        return "cuda" if _cuda_available() else "cpu"
    return "cuda" if spec.startswith("cuda") else "cpu"


def _cuda_available() -> bool:
    """``torch.cuda.is_available()``, without importing torch for a CPU-only build (its
    version says ``+cpu``), so ``config show`` stays fast there."""
    if "torch" not in sys.modules:
        try:
            if "+cpu" in importlib.metadata.version("torch"):
                return False
        except importlib.metadata.PackageNotFoundError:
            return False
    import torch

    return torch.cuda.is_available()


def report(cfg: PosttrainConfig) -> list[str]:
    """``# ``-prefixed lines for ``config show``: each part, each role, the peak."""
    try:
        shape = model_shape(cfg)
    except (KeyError, TypeError, ValueError) as e:
        return [f"# memory estimate: {cfg.model.name_or_path}/config.json is not a decoder "
                f"config this estimate reads ({type(e).__name__}: {e})"]  # fmt: skip
    if shape is None:
        return [f"# memory estimate: no config.json in {cfg.model.name_or_path!r} and no "
                "model.init_preset; nothing to estimate from"]  # fmt: skip
    device = device_kind(cfg)
    p = prompt_tokens(cfg)
    parts = estimate(cfg, shape, p, device)
    lines = [f"# memory estimate ({device}, prompts up to {p} tokens, MB):"]
    for role in dict.fromkeys(x.role for x in parts):
        mine = [x for x in parts if x.role == role]
        phases = [sum(x.bytes for x in mine if x.phase == ph) for ph in PHASES]
        lines.append(f"#   {role}: {phases[0] / MB:,.0f} held, up to {max(phases[1:]) / MB:,.0f} "
                     "more in one phase")  # fmt: skip
        lines += [
            f"#     {x.name}: {x.bytes / MB:,.0f}" + ("" if x.phase == "held" else f" ({x.phase})")
            for x in mine
        ]
    lines.append(
        f"#   peak (one process: held all run + the largest phase): {peak(parts) / MB:,.0f}"
    )
    return lines
