"""Class-conditional diffusion models in diffusers' folder layout, and deterministic sampling.

A model folder is what ``DDPMPipeline.save_pretrained`` writes: ``model_index.json``,
``unet/`` (a ``UNet2DModel`` with ``num_class_embeds`` classes: config.json and
diffusion_pytorch_model.safetensors) and ``scheduler/`` (the DDPM training schedule). Bring your
own by saving such a pipeline; nothing is downloaded.

Sampling uses DDIM (eta from 0, deterministic, to 1, DDPM-like) with per-sample seeded noise, so
a fixed list of seeds gives the same images for the same weights however many samples are drawn
together (up to the rounding of batched kernels).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from posttrain.config import ConfigError


def _diffusers():
    try:
        import diffusers
    except ImportError as e:  # an optional extra
        raise ConfigError(
            f"DPO needs diffusers ({e}); install it with pip install 'posttrain[diffusion]'"
        ) from e
    return diffusers


def build_tiny_unet(
    image_size: int, num_classes: int, seed: int, channels: Sequence[int] = (32, 64, 64)
) -> nn.Module:
    """A small randomly initialised class-conditional UNet2DModel (about 1.1M parameters with
    the default channels; three resolutions, so a 16 px shape is seen whole at the bottom)."""
    diffusers = _diffusers()
    torch.manual_seed(seed)
    blocks = len(channels)
    return diffusers.UNet2DModel(
        sample_size=image_size,
        in_channels=3,
        out_channels=3,
        layers_per_block=1,
        block_out_channels=tuple(channels),
        down_block_types=("DownBlock2D",) * blocks,
        up_block_types=("UpBlock2D",) * blocks,
        norm_num_groups=8,
        num_class_embeds=num_classes,
    )


def new_scheduler(num_train_timesteps: int = 1000):
    """The DDPM training schedule a new base model is trained with: ε-prediction, cosine betas
    (``squaredcos_cap_v2``; linear betas spend too many steps near pure noise for 16 px images)."""
    return _diffusers().DDPMScheduler(
        num_train_timesteps=num_train_timesteps, beta_schedule="squaredcos_cap_v2"
    )


def save_pipeline(directory: str | Path, unet: nn.Module, scheduler) -> None:
    """Write ``unet`` and ``scheduler`` as a DDPMPipeline folder."""
    _diffusers().DDPMPipeline(unet=unet, scheduler=scheduler).save_pretrained(str(directory))


def unet_config(directory: str | Path) -> dict:
    """The UNet's config.json of a pipeline folder, checked to be class-conditional (no weights
    are read: callers validate data against the model's image size and classes first)."""
    path = Path(directory) / "unet" / "config.json"
    if not path.is_file():
        raise ConfigError(
            f"{str(directory)!r} is not a diffusers pipeline folder (no unet/config.json); run "
            "`posttrain dpo pretrain --out DIR` or save a DDPMPipeline there"
        )
    config = json.loads(path.read_text())
    if not config.get("num_class_embeds"):
        raise ConfigError(
            f"{path} is not class-conditional (num_class_embeds is null); DPO conditions "
            "on a class id per pair"
        )
    return config


def load_pipeline(directory: str | Path, device: str | torch.device = "cpu"):
    """(unet in float32 on ``device``, DDPM scheduler) from a pipeline folder."""
    path = Path(directory)
    unet_config(path)
    d = _diffusers()
    unet = d.UNet2DModel.from_pretrained(str(path), subfolder="unet").to(device).float()
    from posttrain.model.loading import refuse_nonfinite

    refuse_nonfinite(unet, path / "unet")
    scheduler = d.DDPMScheduler.from_pretrained(str(path), subfolder="scheduler")
    return unet, scheduler


def alphas_cumprod(scheduler) -> Tensor:
    """ᾱ_t for t = 0..T-1 of a DDPM schedule, float64 (the objectives cast as they need)."""
    return scheduler.alphas_cumprod.to(torch.float64).clone()


@torch.no_grad()
def sample(
    unet: nn.Module,
    scheduler,
    labels: Tensor,
    seeds: Sequence[int],
    steps: int,
    eta: float,
    batch: int = 64,
) -> Tensor:
    """Images ``[N, 3, H, W]`` in [-1, 1] for class ``labels[i]`` from seed ``seeds[i]``.

    DDIM with ``eta`` (0: deterministic; 1: the DDPM posterior's variance at each step). Sample
    i draws its starting noise and then each step's noise from its own generator seeded with
    ``seeds[i]``, so a sample does not depend on which others are drawn with it (up to the
    rounding of batched kernels; the same seeds and batch give the same bits).
    """
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1], got {eta}")
    d = _diffusers()
    ddim = d.DDIMScheduler.from_config(scheduler.config)
    ddim.set_timesteps(steps)
    device = next(unet.parameters()).device
    size = unet.config.sample_size
    was_training = unet.training
    unet.eval()
    out = []
    try:
        for start in range(0, len(seeds), batch):
            gens = [torch.Generator().manual_seed(int(s)) for s in seeds[start : start + batch]]
            y = labels[start : start + batch].to(device)
            x = _noise(gens, size).to(device)
            for t in ddim.timesteps:
                eps = unet(x, t.to(device), class_labels=y).sample
                extra = {"variance_noise": _noise(gens, size).to(device)} if eta > 0 else {}
                x = ddim.step(eps, t, x, eta=eta, **extra).prev_sample
            out.append(x.clamp(-1, 1).cpu())
    finally:
        unet.train(was_training)
    return torch.cat(out)


def _noise(generators: Sequence[torch.Generator], size: int) -> Tensor:
    """One ``[3, size, size]`` standard normal draw from each sample's own generator."""
    return torch.stack([torch.randn(3, size, size, generator=g) for g in generators])
