"""How noisy is OPD's advantage-mode gradient next to the direct mode's, on the same samples?

Per response position the advantage mode's expected gradient is the direct reverse-KL gradient:
``E_{y~q}[(log q(y) - log p(y)) ∇log q(y)] = ∇ KL(q || p)``. The advantage mode sees one sampled
token per position, the direct mode the teacher's whole distribution there, so the two differ only
in variance. This script measures it on the ``opd_arithmetic`` recipe: for several independently
sampled batches it computes both gradients and prints the cosine between them, and between the
same mode's gradients on different batches (how repeatable a step's direction is).

    python benchmarks/opd_gradient_noise.py [--student DIR] [--batches 4]
"""

from __future__ import annotations

import argparse
import itertools

import torch

from posttrain.algorithm.opd import make_objective
from posttrain.config import load_config
from posttrain.config.build import objective_context
from posttrain.data.tasks import make_task_source
from posttrain.model.loading import load_policy
from posttrain.placement.teacher import TeacherRole
from posttrain.rollout import TorchRolloutEngine
from posttrain.run.records import encode_prompts, quiet_libraries

RECIPE = "opd_arithmetic"


def gradient(objective, model, batch) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    if objective.old_logp_cache is not None:
        objective.old_logp_cache.follow_policy(batch)
    loss, _ = objective(model, batch)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--student", default=None, help="student model dir (default: the recipe's)")
    parser.add_argument("--batches", type=int, default=4)
    args = parser.parse_args()
    quiet_libraries()
    opts = ["rl.distillation_mode=direct", "teacher.top_k=1000"]
    if args.student:
        opts.append(f"model.name_or_path={args.student}")
    cfg = load_config(RECIPE, ["--", *opts])
    model, tokenizer = load_policy(cfg.model.name_or_path, None, "float32")
    teacher = TeacherRole(cfg)
    adv_rl = cfg.rl.model_copy(update={"distillation_mode": "advantage"})
    context = objective_context(cfg)
    advantage, direct = make_objective(adv_rl, context), make_objective(cfg.rl, context)
    d = cfg.data
    tasks = make_task_source(d.task, seed=cfg.job.seed, digits=d.digits, operators=d.operators,
                             train_size=d.train_size, val_size=d.val_size)  # fmt: skip
    engine = TorchRolloutEngine(model, tokenizer)
    grads = {"advantage": [], "direct": []}
    cursor = 0
    for i in range(args.batches):
        items, cursor = tasks.take(cfg.job.seed, cursor, d.prompts_per_step)
        prompts = encode_prompts(items, d, tokenizer)
        rollout = engine.generate(prompts, n=cfg.rollout.n, temperature=1.0, top_p=1.0,
                                  max_tokens=cfg.rollout.max_tokens, seed=i)  # fmt: skip
        batch = rollout.batch.replace(**teacher.annotations(rollout.batch))
        grads["advantage"].append(gradient(advantage, model, batch))
        grads["direct"].append(gradient(direct, model, batch))
    same = [cosine(a, b) for a, b in zip(grads["advantage"], grads["direct"], strict=True)]
    print(f"rows per batch: {len(batch)}, batches: {args.batches}")
    print(f"cos(advantage, direct) on the same batch: mean {sum(same) / len(same):.3f}")
    for mode, gs in grads.items():
        pairs = [cosine(a, b) for a, b in itertools.combinations(gs, 2)]
        print(f"cos({mode}, {mode}) across batches: mean {sum(pairs) / len(pairs):.3f}")
    mean_adv = torch.stack(grads["advantage"]).mean(0)
    mean_dir = torch.stack(grads["direct"]).mean(0)
    print(f"cos(mean advantage, mean direct) over {args.batches} batches: "
          f"{cosine(mean_adv, mean_dir):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
