"""Names users bring from TRL and verl, and the posttrain key each one means.

Read by "did you mean" only: ``rl.learning_rate=1e-5`` is refused with ``did you mean rl.lr?
(learning_rate in TRL)``, never accepted, so every key keeps one spelling. The table in
docs/guides/config.md is rendered from :data:`PEER_NAMES` (a test keeps them equal), and the peer
table of docs/guides/objectives.md is tested against it.

A user's key is matched by its whole dotted name against verl's names (``data.train_batch_size``),
and by its last part against TRL's flat argument names (``rollout.num_generations``), the common
spellings in :attr:`PeerName.common` (``data.batch_size``) and the last part of a verl name when
that part is specific (has an underscore: ``clip_ratio_low``, not ``n``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PeerName:
    """``key`` in posttrain is ``trl`` in TRL's ``GRPOConfig``, ``verl`` in verl's config, and is
    also often written ``common`` (each empty where there is no such name)."""

    key: str
    trl: str = ""
    verl: str = ""
    common: tuple[str, ...] = ()


PEER_NAMES: tuple[PeerName, ...] = (
    PeerName("job.name", "run_name", "trainer.experiment_name"),
    PeerName("job.output_root", "output_dir", "trainer.default_local_dir"),
    PeerName("job.seed", "seed"),
    PeerName("model.name_or_path", "model_name_or_path", "actor_rollout_ref.model.path",
             ("model_path", "model_name")),
    PeerName("model.gradient_checkpointing", "gradient_checkpointing",
             "actor_rollout_ref.model.enable_gradient_checkpointing"),
    PeerName("model.lora_rank", "lora_r", "actor_rollout_ref.model.lora_rank"),
    PeerName("model.lora_alpha", "lora_alpha", "actor_rollout_ref.model.lora_alpha"),
    PeerName("model.lora_target_modules", "lora_target_modules",
             "actor_rollout_ref.model.target_modules"),
    PeerName("data.train_path", "", "data.train_files", ("train_file", "train_files")),
    PeerName("data.val_path", "", "data.val_files", ("val_file", "eval_file", "test_file")),
    PeerName("data.prompts_per_step", "", "data.train_batch_size",
             ("batch_size", "prompts_per_batch")),
    PeerName("rollout.n", "num_generations", "actor_rollout_ref.rollout.n",
             ("num_samples", "group_size")),
    PeerName("rollout.max_tokens", "max_completion_length", "data.max_response_length",
             ("max_new_tokens", "max_response_length")),
    PeerName("rollout.temperature", "temperature", "actor_rollout_ref.rollout.temperature"),
    PeerName("rollout.top_p", "top_p", "actor_rollout_ref.rollout.top_p"),
    PeerName("reward.mask_truncated", "mask_truncated_completions"),
    PeerName("reward.overlong_buffer", "", "reward_model.overlong_buffer.len"),
    PeerName("reward.overlong_penalty", "", "reward_model.overlong_buffer.penalty_factor"),
    PeerName("rl.lr", "learning_rate", "actor_rollout_ref.actor.optim.lr"),
    PeerName("rl.warmup_steps", "warmup_steps", "actor_rollout_ref.actor.optim.lr_warmup_steps"),
    PeerName("rl.lr_schedule", "lr_scheduler_type"),
    PeerName("rl.max_steps", "max_steps", "trainer.total_training_steps"),
    PeerName("rl.grad_clip", "max_grad_norm", "actor_rollout_ref.actor.grad_clip"),
    PeerName("rl.save_every", "save_steps", "trainer.save_freq"),
    PeerName("rl.eval_every", "eval_steps", "trainer.test_freq"),
    PeerName("rl.micro_batch_size", "", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    PeerName("rl.kl_beta", "beta", "actor_rollout_ref.actor.kl_loss_coef", ("kl_coef",)),
    PeerName("rl.kl_estimator", "", "actor_rollout_ref.actor.kl_loss_type"),
    PeerName("rl.epsilon_low", "epsilon", "actor_rollout_ref.actor.clip_ratio_low",
             ("clip_ratio", "cliprange")),
    PeerName("rl.epsilon_high", "epsilon_high", "actor_rollout_ref.actor.clip_ratio_high"),
    PeerName("rl.lower_bound_ratio", "", "actor_rollout_ref.actor.clip_ratio_c"),
    PeerName("rl.loss_type", "loss_type", "actor_rollout_ref.actor.loss_agg_mode"),
    PeerName("rl.entropy_coef", "", "actor_rollout_ref.actor.entropy_coeff"),
    PeerName("rl.advantage_estimator", "", "algorithm.adv_estimator"),
    PeerName("rl.reward_scaling", "scale_rewards"),
    PeerName("rl.dynamic_sampling", "", "algorithm.filter_groups.enable"),
    PeerName("rl.max_sampling_rounds", "", "algorithm.filter_groups.max_num_gen_batches"),
)  # fmt: skip


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _index() -> tuple[dict[str, PeerName], dict[str, tuple[PeerName, str]]]:
    """(verl dotted name -> entry, last-part name -> (entry, where the name comes from))."""
    dotted = {p.verl: p for p in PEER_NAMES if p.verl}
    leaves: dict[str, tuple[PeerName, str]] = {}
    for p in PEER_NAMES:
        if p.verl and "_" in _leaf(p.verl):
            leaves.setdefault(_leaf(p.verl), (p, f"{p.verl} in verl"))
        for name in p.common:
            leaves.setdefault(name, (p, f"{name} in other frameworks"))
    for p in PEER_NAMES:  # TRL's names win: they are what a key's last part most often is
        if p.trl:
            leaves[p.trl] = (p, f"{p.trl} in TRL")
    return dotted, leaves


def peer_key(key: str) -> tuple[str, str] | None:
    """``(posttrain key, where the name comes from)`` for a TRL/verl/common name, else None;
    a key whose last part already is the suggested key's (``rl.lr`` for ``rl.lr``) is not one."""
    dotted, leaves = _index()
    if key in dotted:
        return dotted[key].key, f"{key} in verl"
    found = leaves.get(_leaf(key))
    if found is None or found[0].key == key:
        return None
    return found[0].key, found[1]


def peer_table() -> str:
    """The Markdown table of :data:`PEER_NAMES` that docs/guides/config.md shows."""
    lines = ["| posttrain | TRL | verl | also written |", "|---|---|---|---|"]
    for p in PEER_NAMES:
        cells = [f"`{p.key}`", f"`{p.trl}`" if p.trl else "—", f"`{p.verl}`" if p.verl else "—",
                 ", ".join(f"`{c}`" for c in p.common) or "—"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
