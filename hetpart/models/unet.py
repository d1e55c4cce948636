"""zoo:unet: a diffusion UNet (DDPM-style noise predictor).

Inputs: a noisy image [B, C, H, W] and the diffusion timestep of each sample
[B] (int64). The timestep gets a sinusoidal embedding (computed in the forward)
and an MLP; every residual block adds it to its feature maps. The down path
halves the resolution `n_levels - 1` times; each of its blocks' outputs is
concatenated onto the matching block of the up path, so the U's skips cross
whatever cuts lie between the two paths, and the timestep embedding reaches
every stage. GroupNorm + SiLU throughout; the output is the predicted noise,
shaped like the image.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class UNetConfig:
    in_channels: int = 3
    image_size: int = 32
    base_channels: int = 64
    n_levels: int = 3  # resolutions; channels double at each level down
    groups: int = 8  # GroupNorm groups
    max_timestep: int = 1000


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding [B, dim] of timesteps t [B] (as in DDPM / Transformer positions)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    angles = t.float()[:, None] * freqs[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, t_dim: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.t_proj = nn.Linear(t_dim, c_out)
        self.norm2 = nn.GroupNorm(groups, c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.skip = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.t_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class UNet(nn.Module):
    def __init__(self, cfg: UNetConfig) -> None:
        super().__init__()
        if cfg.image_size % 2 ** (cfg.n_levels - 1):
            from hetpart.errors import HetpartError

            raise HetpartError(f"unet: image_size {cfg.image_size} must divide by 2**(n_levels-1) = "
                               f"{2 ** (cfg.n_levels - 1)}")
        c = cfg.base_channels
        self.t_dim = c
        t_hidden = 4 * c
        self.time_mlp = nn.Sequential(nn.Linear(c, t_hidden), nn.SiLU(), nn.Linear(t_hidden, t_hidden))
        self.stem = nn.Conv2d(cfg.in_channels, c, 3, padding=1)
        chans = [c * 2**i for i in range(cfg.n_levels)]
        self.down = nn.ModuleList()
        self.downsample = nn.ModuleList()
        c_in = c
        for i, ch in enumerate(chans):
            self.down.append(ResBlock(c_in, ch, t_hidden, cfg.groups))
            if i < len(chans) - 1:
                self.downsample.append(nn.Conv2d(ch, ch, 3, stride=2, padding=1))
            c_in = ch
        self.mid = ResBlock(c_in, c_in, t_hidden, cfg.groups)
        self.up = nn.ModuleList()
        self.upsample = nn.ModuleList()
        for i, ch in reversed(list(enumerate(chans))):
            self.up.append(ResBlock(c_in + ch, ch, t_hidden, cfg.groups))  # concatenated skip
            if i > 0:
                self.upsample.append(nn.Conv2d(ch, ch, 3, padding=1))
            c_in = ch
        self.out_norm = nn.GroupNorm(cfg.groups, c)
        self.out = nn.Conv2d(c, cfg.in_channels, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """x: [B, C, H, W] noisy image, t: [B] timesteps -> predicted noise [B, C, H, W]."""
        temb = self.time_mlp(timestep_embedding(t, self.t_dim))
        h = self.stem(x)
        skips = []
        for i, block in enumerate(self.down):
            h = block(h, temb)
            skips.append(h)
            if i < len(self.downsample):
                h = self.downsample[i](h)
        h = self.mid(h, temb)
        for i, block in enumerate(self.up):
            h = block(torch.cat([h, skips.pop()], dim=1), temb)
            if i < len(self.upsample):
                h = self.upsample[i](F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(F.silu(self.out_norm(h)))


def build(cfg: UNetConfig) -> nn.Module:
    return UNet(cfg)


def example_inputs(cfg: UNetConfig, batch_size: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    del seq_len  # images have no sequence dimension
    return (torch.randn(batch_size, cfg.in_channels, cfg.image_size, cfg.image_size),
            torch.randint(0, cfg.max_timestep, (batch_size,)))
