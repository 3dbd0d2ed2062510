"""Rejected settings outside the objective: data sources, batch shape, placement, logging."""

from __future__ import annotations

import math

from posttrain.config.schema import PosttrainConfig
from posttrain.control.rules import are, changed, error, reset_hint


@error("rollout.max_tokens")
def max_tokens_positive_int(cfg: PosttrainConfig) -> str | None:
    """rollout.max_tokens is the only response bound; a config built without validation must
    not slip a bool, fraction or non-positive value past the driver."""
    value = cfg.rollout.max_tokens
    if type(value) is int and value > 0:
        return None
    return f"rollout.max_tokens must be a positive integer, got {value!r}"


@error("data.task", "data.train_path")
def jsonl_needs_train_path(cfg: PosttrainConfig) -> str | None:
    """task=jsonl reads its prompts from data.train_path."""
    if cfg.data.task != "jsonl" or cfg.data.train_path:
        return None
    return "data.task=jsonl needs data.train_path (a JSONL file of question/answer rows)"


@error("data.task", "data.train_path", "data.val_path")
def data_paths_need_jsonl(cfg: PosttrainConfig) -> str | None:
    """Only task=jsonl reads data.train_path and data.val_path."""
    if cfg.data.task == "jsonl":
        return None
    knobs = changed(cfg.data, "train_path", "val_path")
    if not knobs:
        return None
    hint = reset_hint(cfg.data, "train_path", "val_path")
    return f"{are(knobs)} never read by data.task={cfg.data.task}; {hint}, or set data.task=jsonl"


@error("data.task", "data.reasoning_gym_dataset", "data.reasoning_gym_options")
def reasoning_gym_dataset_needs_task(cfg: PosttrainConfig) -> str | None:
    """Only task=reasoning_gym reads data.reasoning_gym_dataset and its options."""
    if cfg.data.task == "reasoning_gym":
        return None
    knobs = changed(cfg.data, "reasoning_gym_dataset", "reasoning_gym_options")
    if not knobs:
        return None
    hint = reset_hint(cfg.data, "reasoning_gym_dataset", "reasoning_gym_options")
    return (
        f"{are(knobs)} never read by data.task={cfg.data.task}; {hint}, or set "
        "data.task=reasoning_gym"
    )


@error("data.prompt_template", "data.system_prompt")
def system_prompt_needs_chat(cfg: PosttrainConfig) -> str | None:
    """A plain prompt has no system turn: the system message would be silently dropped."""
    if cfg.data.prompt_template == "chat" or cfg.data.is_default("system_prompt"):
        return None
    return (
        "data.system_prompt is never read by data.prompt_template=plain (no system turn); "
        "reset with data.system_prompt=@default, put the text in data.user_template, or set "
        "data.prompt_template=chat"
    )


@error("reward.verifier", "data.task")
def reasoning_gym_verifier_needs_task(cfg: PosttrainConfig) -> str | None:
    """The reasoning_gym verifier scores with the dataset entry's own scorer."""
    if cfg.reward.verifier != "reasoning_gym" or cfg.data.task == "reasoning_gym":
        return None
    return (
        f"reward.verifier=reasoning_gym needs data.task=reasoning_gym (got {cfg.data.task}); "
        "use verifier exact, math or last_number"
    )


@error("data.task", "data.digits", "data.operators")
def arithmetic_knobs_need_task(cfg: PosttrainConfig) -> str | None:
    """Only task=arithmetic reads data.digits and data.operators."""
    if cfg.data.task == "arithmetic":
        return None
    knobs = changed(cfg.data, "digits", "operators")
    if not knobs:
        return None
    hint = reset_hint(cfg.data, "digits", "operators")
    return f"{are(knobs)} never read by data.task={cfg.data.task}; {hint}"


@error("data.task", "data.digits", "data.operators", "data.train_size", "data.val_size")
def arithmetic_sizes_fit(cfg: PosttrainConfig) -> str | None:
    """The arithmetic generator draws distinct problems; the splits must fit in its space."""
    from posttrain.data.tasks.arithmetic import arithmetic_space

    d = cfg.data
    if d.task != "arithmetic":
        return None
    space = arithmetic_space(d.digits, d.operators, d.exact_digits)
    if d.train_size + d.val_size <= space:
        return None
    return (
        f"data.train_size + data.val_size = {d.train_size + d.val_size} exceeds the {space} "
        f"distinct problems of data.digits={d.digits}, data.operators={d.operators}; lower the "
        "sizes or raise data.digits"
    )


@error("data.task", "data.train_size", "data.val_size")
def jsonl_reads_whole_files(cfg: PosttrainConfig) -> str | None:
    """task=jsonl trains on every row of data.train_path and validates on every row of
    data.val_path; the generated-task sizes are not read."""
    if cfg.data.task != "jsonl":
        return None
    knobs = changed(cfg.data, "train_size", "val_size")
    if not knobs:
        return None
    hint = reset_hint(cfg.data, "train_size", "val_size")
    return f"{are(knobs)} never read by data.task=jsonl (it reads whole files); {hint}"


@error("rl.lr_schedule", "rl.warmup_steps", "rl.max_steps", "rl.mini_batch_per_replica")
def warmup_fits_the_run(cfg: PosttrainConfig) -> str | None:
    """A decaying schedule needs optimizer steps left after warmup."""
    rl = cfg.rl
    total = rl.max_steps * rl.mini_batch_per_replica
    if rl.lr_schedule == "constant" or rl.warmup_steps < total:
        return None
    return (
        f"rl.warmup_steps={rl.warmup_steps} leaves no steps to decay over: the run has {total} "
        f"optimizer steps (rl.max_steps x rl.mini_batch_per_replica); lower the warmup"
    )


@error("rl.eval_every", "data.task", "data.val_path", "data.val_size")
def eval_needs_validation_data(cfg: PosttrainConfig) -> str | None:
    """Periodic validation needs a validation set: data.val_path for jsonl, data.val_size > 0
    for generated tasks."""
    if cfg.rl.eval_every == 0:
        return None
    if cfg.data.task == "jsonl" and not cfg.data.val_path:
        return f"rl.eval_every={cfg.rl.eval_every} needs data.val_path; set it or rl.eval_every=0"
    if cfg.data.task != "jsonl" and cfg.data.val_size == 0:
        return f"rl.eval_every={cfg.rl.eval_every} needs data.val_size > 0 or rl.eval_every=0"
    return None


@error(
    "data.prompts_per_step",
    "rollout.n",
    "placement.policy_ranks",
    "rl.mini_batch_per_replica",
)
def batch_covers_updates(cfg: PosttrainConfig) -> str | None:
    """Every policy rank needs at least one response in every mini-batch of a step."""
    responses = cfg.data.prompts_per_step * cfg.rollout.n
    needed = cfg.placement.policy_ranks * cfg.rl.mini_batch_per_replica
    if responses >= needed:
        return None
    return (
        f"a step has data.prompts_per_step*rollout.n={responses} responses, fewer than "
        f"placement.policy_ranks*rl.mini_batch_per_replica={needed} mini-batches; raise "
        "prompts_per_step or lower the split"
    )


@error(
    "model.certified_deterministic_forward",
    "data.prompts_per_step",
    "rollout.n",
    "placement.policy_ranks",
    "rl.mini_batch_per_replica",
    "rl.micro_batch_size",
)
def deterministic_minis_fill_micro_batches(cfg: PosttrainConfig) -> str | None:
    """A certified deterministic forward scores π_old in the same micro-batches as the update,
    so every rank's mini-batch must be a whole number of micro-batches (the trainer would stop
    at the first step otherwise). Sizes are computed as dispatch and the trainer split."""
    if not cfg.model.certified_deterministic_forward:
        return None
    from posttrain.placement.dispatch import rank_rows  # torch: only for a certified forward
    from posttrain.trainer.accumulate import split_evenly

    rows = cfg.data.prompts_per_step * cfg.rollout.n
    ranks, minis, micro = (
        cfg.placement.policy_ranks, cfg.rl.mini_batch_per_replica, cfg.rl.micro_batch_size
    )  # fmt: skip
    if rows < ranks * minis:
        return None  # batch_covers_updates reports this
    shards = rank_rows(rows, ranks, minis)
    sizes = sorted({s.stop - s.start for shard in shards for s in split_evenly(len(shard), minis)})
    if all(size % micro == 0 for size in sizes):
        return None
    return (
        f"model.certified_deterministic_forward=true needs every per-rank mini-batch to be a "
        f"multiple of rl.micro_batch_size={micro}, but data.prompts_per_step*rollout.n={rows} "
        f"rows over placement.policy_ranks={ranks} x rl.mini_batch_per_replica={minis} give "
        f"mini-batches of {sizes} rows; set rl.micro_batch_size={math.gcd(*sizes)} (or a "
        "divisor of it), or change data.prompts_per_step"
    )


@error("rl.shared_prefix", "placement.policy_sharding")
def shared_prefix_on_needs_unsharded(cfg: PosttrainConfig) -> str | None:
    """A sharded policy's ranks run every forward together; sharing a prompt takes two forwards
    where a row alone takes one, so ranks with other rows would fall out of step (``auto``
    encodes each row's prompt there)."""
    if cfg.rl.shared_prefix != "on" or cfg.placement.policy_sharding == "none":
        return None
    return (
        "rl.shared_prefix=on with placement.policy_sharding=fsdp: sharded ranks run their "
        "forwards in step, and sharing takes two where a lone row takes one; set "
        "rl.shared_prefix=auto (each row encodes its prompt there) or policy_sharding=none"
    )


@error("rl.micro_batch_tokens", "model.certified_deterministic_forward")
def token_micro_batches_need_uncertified(cfg: PosttrainConfig) -> str | None:
    """A certified π_old is scored in the update's own row chunks; token micro-batches regroup
    the rows, so the two cannot hold together."""
    if cfg.rl.micro_batch_tokens is None or not cfg.model.certified_deterministic_forward:
        return None
    return (
        f"rl.micro_batch_tokens={cfg.rl.micro_batch_tokens} regroups rows by length, but "
        "model.certified_deterministic_forward=true scores π_old in the update's row chunks; "
        "unset rl.micro_batch_tokens or set model.certified_deterministic_forward=false"
    )


@error(
    "placement.backend",
    "placement.ray_address",
    "placement.cpus_per_role",
    "placement.gpus_per_role",
    "placement.policy_ranks",
    "placement.policy_sharding",
)
def ray_knobs_need_ray(cfg: PosttrainConfig) -> str | None:
    """Ray address, per-actor resources, several policy ranks and sharded ones need
    placement.backend=ray (in-process placement runs one unsharded policy rank)."""
    if cfg.placement.backend == "ray":
        return None
    names = ("ray_address", "cpus_per_role", "gpus_per_role", "policy_ranks", "policy_sharding")
    knobs = changed(cfg.placement, *names)
    if not knobs:
        return None
    hint = reset_hint(cfg.placement, *names)
    return f"{are(knobs)} never read by placement.backend=local; {hint}, or use backend=ray"


@error("placement.backend", "placement.device")
def device_needs_local(cfg: PosttrainConfig) -> str | None:
    """placement.device places the roles of an in-process run; Ray actors get their device from
    placement.gpus_per_role."""
    if cfg.placement.backend == "local" or cfg.placement.is_default("device"):
        return None
    return (
        f"placement.device={cfg.placement.device} is never read by placement.backend=ray (Ray "
        "actors run on CUDA when placement.gpus_per_role > 0); remove it"
    )


@error("rl.optimizer", "rl.adam_beta1", "rl.adam_beta2")
def adam_betas_need_adamw(cfg: PosttrainConfig) -> str | None:
    """The Adam moment decays are read only by rl.optimizer=adamw."""
    if cfg.rl.optimizer == "adamw":
        return None
    knobs = changed(cfg.rl, "adam_beta1", "adam_beta2")
    if not knobs:
        return None
    hint = reset_hint(cfg.rl, "adam_beta1", "adam_beta2")
    return f"{are(knobs)} never read by rl.optimizer={cfg.rl.optimizer}; {hint}, or use adamw"


@error("logging.wandb", "logging.wandb_mode", "logging.wandb_project")
def wandb_knobs_need_wandb(cfg: PosttrainConfig) -> str | None:
    """W&B mode and project are read only when logging.wandb=true."""
    if cfg.logging.wandb:
        return None
    knobs = changed(cfg.logging, "wandb_mode", "wandb_project")
    if not knobs:
        return None
    hint = reset_hint(cfg.logging, "wandb_mode", "wandb_project")
    return f"{are(knobs)} never read with logging.wandb=false; {hint}, or set logging.wandb=true"


@error("reward.overlong_buffer", "rollout.max_tokens")
def overlong_buffer_fits(cfg: PosttrainConfig) -> str | None:
    """The overlong ramp lies inside the response bound: its buffer cannot exceed it."""
    buffer, bound = cfg.reward.overlong_buffer, cfg.rollout.max_tokens
    if buffer <= bound:
        return None
    return (
        f"reward.overlong_buffer={buffer} exceeds rollout.max_tokens={bound}; the punishment "
        "ramps over the last overlong_buffer tokens before the bound, so lower it"
    )


@error("reward.functions_anneal_steps", "reward.functions")
def anneal_needs_functions(cfg: PosttrainConfig) -> str | None:
    """The anneal weights the reward functions' sum: with none, nothing reads it."""
    steps = cfg.reward.functions_anneal_steps
    if not steps or cfg.reward.functions:
        return None
    return (
        f"reward.functions_anneal_steps={steps} fades the reward functions, and "
        "reward.functions is empty; set reward.functions or reset with "
        "reward.functions_anneal_steps=@default"
    )


@error("model.lora_rank", "model.lora_alpha", "model.lora_target_modules")
def lora_knobs_need_rank(cfg: PosttrainConfig) -> str | None:
    """LoRA scale and target modules are read only when model.lora_rank > 0."""
    if cfg.model.lora_rank:
        return None
    knobs = changed(cfg.model, "lora_alpha", "lora_target_modules")
    if not knobs:
        return None
    hint = reset_hint(cfg.model, "lora_alpha", "lora_target_modules")
    return f"{are(knobs)} never read with model.lora_rank=0; {hint} or set model.lora_rank"


RULES = (
    max_tokens_positive_int,
    jsonl_needs_train_path,
    data_paths_need_jsonl,
    reasoning_gym_dataset_needs_task,
    system_prompt_needs_chat,
    arithmetic_knobs_need_task,
    arithmetic_sizes_fit,
    reasoning_gym_verifier_needs_task,
    eval_needs_validation_data,
    batch_covers_updates,
    deterministic_minis_fill_micro_batches,
    shared_prefix_on_needs_unsharded,
    token_micro_batches_need_uncertified,
    ray_knobs_need_ray,
    device_needs_local,
    adam_betas_need_adamw,
    jsonl_reads_whole_files,
    warmup_fits_the_run,
    wandb_knobs_need_wandb,
    overlong_buffer_fits,
    anneal_needs_functions,
    lora_knobs_need_rank,
)
