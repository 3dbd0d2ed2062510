"""Policy models: loading local HF folders, tiny test models, the SmolLM2 import, capabilities."""

from posttrain.model.gguf_import import import_gguf
from posttrain.model.loading import load_policy
from posttrain.model.protocol import ModelCapabilities, capabilities_from_config, model_capabilities
from posttrain.model.tiny import PRESETS, build_tiny_model, count_parameters, tiny_config
from posttrain.model.tokenizer import build_char_tokenizer, load_tokenizer

__all__ = [
    "PRESETS",
    "ModelCapabilities",
    "build_char_tokenizer",
    "build_tiny_model",
    "capabilities_from_config",
    "count_parameters",
    "import_gguf",
    "load_policy",
    "load_tokenizer",
    "model_capabilities",
    "tiny_config",
]
