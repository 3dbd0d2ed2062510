"""posttrain's side of ``vs_trl.py``: one GRPO step at a time, with per-phase wall times.

The step is the GRPO entry's loop body (``online.collect``: rollout -> reward stage; then the
update and the weight sync) on the roles ``placement.local`` builds, so it measures exactly what ``posttrain grpo`` runs. Phases
inside the update are read from forward hooks (see ``PhaseClock``): the frozen reference's
forwards, no-grad policy forwards during the update (a separate π_old capture), and grad-enabled
policy forwards; what remains of the update is loss math, backward and the optimizer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


class PhaseClock:
    """Sums the wall time of a module's forwards into named buckets while ``armed``.

    ``bucket_of()`` picks the bucket when a forward starts (e.g. by ``torch.is_grad_enabled``),
    so one module's forwards can be told apart by why they run.
    """

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.armed = False
        self._open: dict[int, tuple[str, float]] = {}

    def watch(self, module: nn.Module, bucket_of) -> None:
        def pre(mod, args, kwargs=None):
            if self.armed:
                self._open[id(mod)] = (bucket_of(), time.perf_counter())

        def post(mod, args, out):
            started = self._open.pop(id(mod), None)
            if started is not None:
                name, t0 = started
                self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - t0

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def take(self) -> dict[str, float]:
        out, self.totals = self.totals, {}
        return out


@dataclass(frozen=True)
class Workload:
    name: str
    preset: str
    prompts: int
    n: int
    max_tokens: int
    kl_beta: float
    lr: float
    micro_batch: int


def posttrain_opts(w: Workload, model_dir: Path, out_root: Path, steps: int) -> list[str]:
    """Overrides on the ``arithmetic_clipped`` recipe that pin the shared workload."""
    return [
        f"job.output_root={out_root}",
        f"model.name_or_path={model_dir}",
        f"data.prompts_per_step={w.prompts}",
        f"rollout.n={w.n}",
        f"rollout.max_tokens={w.max_tokens}",
        "rollout.temperature=1.0",
        "rl.temperature=1.0",
        f"rl.kl_beta={w.kl_beta}",
        f"rl.lr={w.lr}",
        "rl.lr_schedule=constant",
        "rl.weight_decay=0.0",
        "rl.adam_beta2=0.999",
        "rl.grad_clip=1.0",
        f"rl.micro_batch_size={w.micro_batch}",
        f"rl.max_steps={steps}",
        "rl.save_every=0",
        "rl.eval_every=0",
        "rl.resume=off",
        "logging.progress=false",
        "placement.torch_threads_per_process=1",
    ]


class PosttrainSide:
    """Builds the local roles once; :meth:`step` runs one timed GRPO step."""

    RECIPE = "arithmetic_clipped"

    def __init__(
        self, w: Workload, model_dir: Path, out_root: Path, steps: int, extra: tuple[str, ...] = ()
    ) -> None:
        from posttrain.config import load_config
        from posttrain.config.build import build_objective
        from posttrain.entrypoints import online
        from posttrain.model.loading import load_tokenizer
        from posttrain.placement.local import place_local

        opts = [*posttrain_opts(w, model_dir, out_root, steps), *extra]
        self.config = load_config(self.RECIPE, ["--", *opts])
        run_dir = out_root / "posttrain"
        run_dir.mkdir(parents=True, exist_ok=True)
        self.tasks = online.build_tasks(self.config)
        self.roles = place_local(self.config, build_objective, str(run_dir))
        self.tokenizer = load_tokenizer(str(model_dir))
        self.clock = PhaseClock()
        policy = self.roles.policy
        self.clock.watch(
            policy.model, lambda: "policy_fwd" if torch.is_grad_enabled() else "pi_old_fwd"
        )
        for reference in policy.trainer.auxiliary_models:  # the frozen reference, if any
            self.clock.watch(reference, lambda: "reference_fwd")
        self.cursor = 0
        self.step_cursors: dict[int, int] = {}  # the data cursor each step starts from
        self.w = w

    def prompts_for(self, step: int) -> list:
        """The task items of ``step`` (same order the GRPO entry would take them)."""
        self.step_cursors[step] = self.cursor
        items, self.cursor = self.tasks.take(self.config.job.seed, self.cursor, self.w.prompts)
        return items

    def step(self, step: int, items: list) -> dict[str, float]:
        from posttrain.entrypoints.online import collect

        roles = self.roles
        t0 = time.perf_counter()
        sampled, result, times = collect(
            self.config, roles, self.tokenizer, self.tasks, self.step_cursors[step], step
        )
        assert list(sampled.items) == list(items), "posttrain sampled other prompts than TRL"
        t2 = time.perf_counter()
        self.clock.armed = True
        try:
            roles.policy.train(result.batch)
        finally:
            self.clock.armed = False
        t3 = time.perf_counter()
        roles.sync_weights()
        t4 = time.perf_counter()
        inner = self.clock.take()
        out = {
            "generate": times["time/rollout_s"], "reward": times["time/reward_s"],
            "sync": t4 - t3, "step": t4 - t0,
        }  # fmt: skip
        out.update(inner)
        out["loss_backward_optim"] = (t3 - t2) - sum(inner.values())
        return out
