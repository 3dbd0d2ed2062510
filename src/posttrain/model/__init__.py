"""Policy models: loading local HF folders (``loading``), tiny test models (``tiny``), the
SmolLM2 import (``gguf_import``), char tokenizers (``tokenizer``), capabilities (``protocol``).

Import the submodule you need: this package imports nothing, so the CLI stays fast.
"""
