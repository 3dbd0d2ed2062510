"""posttrain's side of ``vs_trl.py``: one GRPO step at a time, with per-phase wall times.

The step is the GRPO entry's loop body (``online.collect``: rollout -> reward stage; then the
update and the weight sync) on the roles ``placement.local`` builds, so it measures exactly what ``posttrain grpo`` runs. Phases
inside the update are read from forward hooks (see ``PhaseClock``): the frozen reference's
forwards, no-grad policy forwards during the update (a separate π_old capture), and grad-enabled
policy forwards; what remains of the update is loss math, backward and the optimizer.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


class TreeRss:
    """The peak of the summed resident memory of this process and every descendant, sampled
    every ``period`` s in a daemon thread until :meth:`stop`: an engine in processes of its own
    (vLLM's worker and engine core) is part of the side's memory, which the child's
    ``ru_maxrss`` (one process's peak) does not add up. A sum of RSS counts pages the processes
    share (the libraries each maps) once per process: an upper bound of what they hold."""

    def __init__(self, period: float = 0.2) -> None:
        self.peak_bytes = 0
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._stopped = threading.Event()
        threading.Thread(target=self._run, args=(period,), daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _tree(self) -> int:
        parents: dict[int, int] = {}
        pages: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                parents[int(entry)] = int(fields[1])
                pages[int(entry)] = int(fields[21])
            except (OSError, IndexError, ValueError):
                continue
        tree, grew = {os.getpid()}, True
        while grew:
            more = {p for p, pp in parents.items() if pp in tree} - tree
            tree |= more
            grew = bool(more)
        return sum(pages.get(p, 0) for p in tree) * self._page

    def _run(self, period: float) -> None:
        while not self._stopped.is_set():
            self.peak_bytes = max(self.peak_bytes, self._tree())
            self._stopped.wait(period)


class PhaseClock:
    """Sums the wall time of a module's forwards into named buckets while ``armed``.

    ``bucket_of()`` picks the bucket when a forward starts (e.g. by ``torch.is_grad_enabled``),
    so one module's forwards can be told apart by why they run; None leaves it untimed.
    """

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.armed = False
        self._open: dict[int, tuple[str, float]] = {}

    def watch(self, module: nn.Module, bucket_of) -> None:
        def pre(mod, args, kwargs=None):
            bucket = bucket_of() if self.armed else None
            if bucket is not None:
                self._open[id(mod)] = (bucket, time.perf_counter())

        def post(mod, args, out):
            started = self._open.pop(id(mod), None)
            if started is not None:
                name, t0 = started
                self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - t0

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def inside(self, bucket: str) -> bool:
        """A forward timed as ``bucket`` is running (a nested forward must not count twice)."""
        return any(name == bucket for name, _ in self._open.values())

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
    #: Recipe the overrides apply to (its task, prompt template and LoRA settings stay).
    recipe: str = "arithmetic_clipped"
    #: LoRA rank on every linear layer (0: full fine-tuning); TRL gets the same ``peft_config``.
    lora_rank: int = 0
    #: ``data.user_template``: e.g. a few-shot preamble before ``{prompt}``.
    user_template: str = "{prompt}"
    threads: int = 1

    @property
    def lora_targets(self) -> list[str]:
        return ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


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
        f"placement.torch_threads_per_process={w.threads}",
        *(
            [
                f"model.lora_rank={w.lora_rank}",
                f"model.lora_alpha={2.0 * w.lora_rank}",
                f"model.lora_target_modules=[{','.join(w.lora_targets)}]",
            ]
            if w.lora_rank
            else []
        ),  # fmt: skip
    ]


def workload_config(
    w: Workload, model_dir: Path, out_root: Path, steps: int, extra: tuple[str, ...] = ()
):
    """The resolved posttrain config of the workload (both sides read prompts from it)."""
    from posttrain.config import load_config

    config = load_config(w.recipe, ["--", *posttrain_opts(w, model_dir, out_root, steps), *extra])
    # Set on the object: a preamble's newlines and quotes do not survive an override string.
    config.data.user_template = w.user_template
    return config


def prompt_rows(config, tokenizer, tasks, prompts: int, steps: int) -> list[dict]:
    """``{"prompt", "answer"}`` per prompt of steps 1..steps, in the order the GRPO entry takes
    them, formatted as posttrain formats them (chat template, system prompt, user template)."""
    from posttrain.data.tasks import format_prompt

    data, cursor, rows = config.data, 0, []
    for _ in range(steps):
        items, cursor = tasks.take(config.job.seed, cursor, prompts)
        rows += [
            {
                "prompt": format_prompt(
                    it,
                    data.prompt_template,
                    tokenizer,
                    system_prompt=data.system_prompt,
                    user_template=data.user_template,
                ),
                "answer": it.answer,
            }  # fmt: skip
            for it in items
        ]
    return rows


class PosttrainSide:
    """Builds the local roles once; :meth:`step` runs one timed GRPO step."""

    def __init__(
        self, w: Workload, model_dir: Path, out_root: Path, steps: int, extra: tuple[str, ...] = ()
    ) -> None:
        from posttrain.config.build import build_objective
        from posttrain.control.data_checks import load_tasks
        from posttrain.model.loading import load_tokenizer
        from posttrain.placement.local import place_local

        self.config = workload_config(w, model_dir, out_root, steps, extra)
        run_dir = out_root / "posttrain"
        run_dir.mkdir(parents=True, exist_ok=True)
        self.tasks = load_tasks(self.config)
        self.roles = place_local(self.config, build_objective, str(run_dir))
        self.tokenizer = load_tokenizer(str(model_dir))
        self.clock = PhaseClock()
        policy = self.roles.policy
        # A LoRA reference is the policy module with its adapters off (peft's tuner layers say
        # so while it runs): time it as the reference.
        tuner = next(
            (m for m in policy.model.modules() if hasattr(type(m), "_disable_adapters")), None
        )

        def bucket() -> str | None:
            if self.clock.inside("reference_fwd"):
                return None
            if torch.is_grad_enabled():
                return "policy_fwd"
            return "reference_fwd" if tuner is not None and tuner.disable_adapters else "pi_old_fwd"

        self.clock.watch(policy.model, bucket)
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
        from posttrain.run.online import collect

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
