"""One data-parallel rank (gloo, CPU): ``python dp_worker.py RANK WORLD STORE OUT_DIR``.

Trains every case of dp_cases.py on this rank's shard and saves the resulting parameters,
gradients and losses to OUT_DIR/rank{RANK}.pt; then writes and reloads a two-rank checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "src")]

import torch  # noqa: E402

torch.set_num_threads(1)

import torch.distributed as dist  # noqa: E402
from dp_cases import CASES, full_batch, shard, train  # noqa: E402
from gloo_worker import join  # noqa: E402
from trainer_support import TinyCausalLM  # noqa: E402

from posttrain.trainer import CheckpointManager  # noqa: E402


def main() -> None:
    rank, world = join()
    out = Path(sys.argv[4])
    results = {}
    trainer = None
    for name, case in CASES.items():
        micro = case[4]
        # rank 1 starts from different weights: the trainer must broadcast rank 0's
        res = train(name, TinyCausalLM(seed=rank), shard(name, full_batch(name), rank), micro)
        trainer = res.pop("trainer")
        results[name] = res
    torch.save(results, out / f"rank{rank}.pt")
    manager = CheckpointManager(out / "ckpt", keep_last=1)
    torch.manual_seed(100 + rank)  # distinct RNG per rank, saved per rank
    expected = torch.rand(1)
    torch.manual_seed(100 + rank)
    manager.save(1, trainer, config={"rl": {"max_steps": 1}}, data_state={"cursor": rank})
    torch.rand(5)
    state = manager.load(out / "ckpt" / "step_00000001", trainer, config={"rl": {"max_steps": 2}})
    assert torch.equal(torch.rand(1), expected), "this rank's RNG was not restored"
    assert state.data_state == {"cursor": 0}, state.data_state  # rank 0 writes the data cursor
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
