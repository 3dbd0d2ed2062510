"""Load a local Hugging Face causal-LM folder and its tokenizer (never the hub)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from posttrain.model.errors import ModelLoadError
from posttrain.model.tokenizer import load_tokenizer

#: Any of these beside config.json means the folder holds weights.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype {dtype} is not supported; use one of {sorted(DTYPES)}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def check_model_folder(name_or_path: str | Path) -> Path:
    """The folder as a path, once it is known to hold a config and weights (one-line errors)."""
    path = Path(name_or_path)
    if not path.is_dir():
        raise ModelLoadError(
            f"model.name_or_path {str(name_or_path)!r} is not a local directory; models are "
            "loaded offline: point it at a Hugging Face folder (config.json + weights), or "
            "create one with `posttrain model tiny` / `posttrain model import-gguf`"
        )
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"model folder {str(path)!r} has no config.json; is it an HF model folder?"
        )
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ModelLoadError(
            f"model folder {str(path)!r} has a config.json but no weights ({' or '.join(WEIGHT_FILES[::2])}); "
            "copy the weights there, or point model.name_or_path at a complete model folder"
        )
    return path


def refuse_nonfinite(model: torch.nn.Module, folder: str | Path) -> None:
    """Raise :class:`ModelLoadError` naming the first tensor of ``model`` (parameters and
    buffers) that holds NaN or inf: such weights load without complaint, then every step fails
    as if training had diverged. One pass over the weights, a small fraction of loading them."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ModelLoadError(
                f"model folder {str(folder)!r}: tensor {name} holds NaN or inf ({bad} of "
                f"{tensor.numel()} values); the weights are damaged: copy them again, or point "
                "model.name_or_path at a model whose weights are finite"
            )


def load_policy(
    name_or_path: str | Path,
    tokenizer_path: str | Path | None = None,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device | None = None,
    skeleton: bool = False,
) -> tuple[PreTrainedModel, object]:
    """``(model, tokenizer)`` from a local HF folder, weights cast to ``dtype`` on ``device``.

    ``tokenizer_path`` defaults to the model folder. A tokenizer without a pad token gets its
    EOS token as pad (padding is always masked, so the choice only needs to be a valid id).
    The model is returned in eval mode; the trainer switches modes itself.

    ``skeleton``: build the modules from ``config.json`` on the meta device and read no weights
    (``device`` is ignored): what a sharded policy rank other than 0 loads, since its shards
    are filled from rank 0's weights (``trainer.sharding.shard_model``).
    """
    path = check_model_folder(name_or_path)
    torch_dtype = resolve_dtype(dtype)
    if skeleton:
        return _skeleton(path, torch_dtype), _policy_tokenizer(tokenizer_path or path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=True)
    except Exception as e:  # transformers/safetensors raise many types for a damaged folder
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelLoadError(
            f"model folder {str(path)!r}: the weights do not load ({type(e).__name__}: "
            f"{first[:200]}); they may be truncated or damaged: copy them again"
        ) from e
    refuse_nonfinite(model, path)
    if device is not None:
        model = model.to(device)
    model.eval()
    return model, _policy_tokenizer(tokenizer_path if tokenizer_path is not None else path)


def _skeleton(path: Path, dtype: torch.dtype) -> PreTrainedModel:
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    except Exception as e:  # as for a real load: a damaged config.json
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelLoadError(
            f"model folder {str(path)!r}: its config.json does not build a model "
            f"({type(e).__name__}: {first[:200]})"
        ) from e
    if (path / "generation_config.json").is_file():  # as from_pretrained reads it: its EOS ids
        from transformers import GenerationConfig  # are stop ids (rollout.base.stop_and_pad_ids)

        model.generation_config = GenerationConfig.from_pretrained(path, local_files_only=True)
    return model.eval()


def _policy_tokenizer(path: str | Path):
    tokenizer = load_tokenizer(path)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(
                f"tokenizer at {str(path)!r} has neither a pad nor an eos "
                "token; add one of them to its special tokens"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
