"""The forward (noising) process of DDPM as the Model Zoo's DiT trains it (layers/GaussianDiffusion.py,
layers/schedulers.py): ``x_t = sqrt(abar_t) * x_0 + sqrt(1 - abar_t) * eps`` with ``abar_t`` the running
product of ``1 - beta`` over the linear beta schedule of Ho et al. (``beta_start .. beta_end`` at 1000 steps,
scaled by ``1000 / num_diffusion_steps``). The timesteps and the noise come with the batch (the data draws them).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["linear_betas", "GaussianDiffusion"]


def linear_betas(num_diffusion_steps: int, beta_start: float, beta_end: float) -> torch.Tensor:
    """float64 ``[num_diffusion_steps]``: get_named_beta_schedule("linear", ...)."""
    scale = 1000 / num_diffusion_steps
    return torch.linspace(scale * beta_start, scale * beta_end, num_diffusion_steps, dtype=torch.float64)


class GaussianDiffusion(nn.Module):
    """Noised latents from clean ones. The two tables are float32 parameters that are not trained
    (``sqrt_alphas_cum_prod``, ``sqrt_one_minus_alphas_cum_prod``: the vendor's names, so checkpoints carry
    them), computed in float64 first."""

    def __init__(self, num_diffusion_steps: int, beta_start: float, beta_end: float) -> None:
        super().__init__()
        abar = torch.cumprod(1.0 - linear_betas(num_diffusion_steps, beta_start, beta_end), dim=0)
        self.num_diffusion_steps = num_diffusion_steps
        self.sqrt_alphas_cum_prod = nn.Parameter(abar.sqrt().float(), requires_grad=False)
        self.sqrt_one_minus_alphas_cum_prod = nn.Parameter((1 - abar).sqrt().float(), requires_grad=False)

    def forward(self, latent: torch.Tensor, noise: torch.Tensor, timestep: torch.Tensor) -> torch.Tensor:
        """``[b, c, h, w]`` noised latents, computed in the half type under mixed precision as the vendor's.

        Note: the vendor casts the coefficients and the result to the half type even in a float32 run (where its
        model then fails); here the type is autocast's under mixed precision and the latent's otherwise.
        """
        if latent.dim() != 4:
            raise ValueError(f"GaussianDiffusion: latents must be [batch, channels, height, width], got "
                             f"{list(latent.shape)}")
        device = latent.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else latent.dtype
        shape = (latent.shape[0],) + (1,) * (latent.dim() - 1)
        t = timestep.long()
        a = torch.index_select(self.sqrt_alphas_cum_prod, 0, t).view(shape).to(dtype)
        b = torch.index_select(self.sqrt_one_minus_alphas_cum_prod, 0, t).view(shape).to(dtype)
        return (a * latent + b * noise).to(dtype)
