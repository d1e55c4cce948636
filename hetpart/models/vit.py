"""zoo:vit: a Vision Transformer classifier.

A strided convolution cuts the image into patches and embeds them, a learned
class token is prepended (expanded to the batch in the forward), learned
position embeddings are added, pre-LayerNorm encoder layers follow, and a
linear head classifies the final class token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ViTConfig:
    image_size: int = 32
    patch_size: int = 4
    in_channels: int = 3
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    mlp_dim: int = 1024
    num_classes: int = 10


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.fc1 = nn.Linear(cfg.dim, cfg.mlp_dim)
        self.fc2 = nn.Linear(cfg.mlp_dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, t, 3, self.n_heads, c // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        if cfg.image_size % cfg.patch_size:
            from hetpart.errors import HetpartError

            raise HetpartError(f"vit: image_size {cfg.image_size} must be a multiple of patch_size {cfg.patch_size}")
        n_patches = (cfg.image_size // cfg.patch_size) ** 2
        self.patch_embed = nn.Conv2d(cfg.in_channels, cfg.dim, cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, cfg.dim))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, n_patches + 1, cfg.dim))
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images: [B, C, H, W] -> logits [B, num_classes]."""
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # [B, patches, dim]
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x[:, 0]))


def build(cfg: ViTConfig) -> nn.Module:
    return ViT(cfg)


def example_inputs(cfg: ViTConfig, batch_size: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    del seq_len  # the sequence length is (image_size / patch_size)^2 + 1
    return (torch.randn(batch_size, cfg.in_channels, cfg.image_size, cfg.image_size),)
