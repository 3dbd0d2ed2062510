"""A small but complete training run for the kill-and-resume test.

``python resume_worker.py ROOT LOG STEPS SAVE_EVERY RESUME [HANG_IN_SAVE_AT]``

A tiny Llama (from a config) is trained with a π_old objective, AdamW, clipping and a cosine
schedule on a synthetic stream: batch ``c`` is a pure function of the data cursor ``c``, then
shuffled with the global torch RNG and its advantages scaled with numpy and python RNG draws,
so an exact resume needs the cursor and all three RNG states. Rows come in pairs sharing a
prompt and the shared-prefix forward is on. Losses go to LOG (one JSON line
per step, fsynced). With HANG_IN_SAVE_AT, the save of that step stops after writing the model
(the checkpoint is half-written), writes ROOT.hanging and sleeps until killed.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "src")]

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from trainer_support import VOCAB, pg_objective, tiny_llama  # noqa: E402

import posttrain.trainer.checkpoint as checkpoint_module  # noqa: E402
from posttrain.testing import synthetic_batch  # noqa: E402
from posttrain.trainer import CheckpointManager, LLMTrainer  # noqa: E402


def batch_at(cursor: int):
    b = synthetic_batch(VOCAB, 6, seed=1000 + cursor, sample_id_offset=6 * cursor)
    # Rows 2k and 2k+1 answer one prompt, so the shared-prefix forward (on) has groups to share.
    p = b.prompt_width
    ids, mask = b.input_ids.clone(), b.attention_mask.clone()
    ids[1::2, :p], mask[1::2, :p] = ids[0::2, :p], mask[0::2, :p]
    b = b.replace(input_ids=ids, attention_mask=mask)
    b = b[torch.randperm(len(b))]
    scale = (1 + 0.1 * np.random.rand()) * (1 + 0.1 * random.random())
    return b.replace(advantages=b.advantages * scale)


def hang_while_saving(root: Path, at: int):
    real = checkpoint_module.save_model_dir
    saving = {"step": None}

    def save_model_dir(model, directory, tokenizer=None):
        real(model, directory, tokenizer)
        if saving["step"] == at:
            Path(f"{root}.hanging").write_text("saving\n")
            time.sleep(600)

    checkpoint_module.save_model_dir = save_model_dir
    return saving


def main() -> None:
    root, log = Path(sys.argv[1]), Path(sys.argv[2])
    steps, save_every, resume = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    hang_at = int(sys.argv[6]) if len(sys.argv) > 6 else None
    saving = hang_while_saving(root, hang_at) if hang_at else {"step": None}
    random.seed(0), np.random.seed(0), torch.manual_seed(0)
    trainer = LLMTrainer(
        tiny_llama(dtype=torch.float32),
        pg_objective("seq-mean-token-mean", use_pi_old=True),
        lr=3e-3,
        micro_batch_size=2,
        weight_decay=0.01,
        grad_clip=1.0,
        lr_schedule="cosine",
        warmup_steps=2,
        total_steps=steps,
        shared_prefix="on",
    )
    config = {"job": {"name": "resume-test"}, "rl": {"max_steps": steps, "lr": 3e-3}}
    manager = CheckpointManager(root, keep_last=2)
    state = manager.resume(trainer, mode=resume, config=config)
    step, cursor = (state.step, state.data_state["cursor"]) if state else (0, 0)
    with log.open("a") as f:
        while step < steps:
            metrics = trainer.train_on_batch(batch_at(cursor), mini_batches=2)
            cursor += 1
            step += 1
            f.write(json.dumps({"step": step, "losses": [m["train/loss"] for m in metrics]}) + "\n")
            f.flush()
            os.fsync(f.fileno())
            if step % save_every == 0 or step == steps:
                saving["step"] = step
                manager.save(step, trainer, config=config, data_state={"cursor": cursor})


if __name__ == "__main__":
    main()
