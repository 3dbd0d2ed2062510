"""Activation (gradient) checkpointing on a Hugging Face model: recompute each layer's
activations in the backward instead of keeping them, which is what brings a step's peak memory
close to the weights (the trainer turns it on for ``model.gradient_checkpointing``)."""

from __future__ import annotations

from torch import nn


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Hugging Face activation checkpointing (transformers 5 name first, then the 4.x name)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(
            "gradient_checkpointing=True needs a Hugging Face model (activation_checkpointing_enable "
            f"or gradient_checkpointing_enable); {type(model).__name__} has neither"
        )
    if getattr(model, "config", None) is not None and hasattr(model.config, "use_cache"):
        model.config.use_cache = False
