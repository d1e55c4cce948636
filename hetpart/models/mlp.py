"""zoo:mlp: a residual MLP whose input projection also skips to the head.

Two kinds of values cross stage cuts: each block's residual, and the long skip
from the input projection to the head, which passes through every stage in
between when the model is cut into several.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class MLPConfig:
    in_features: int = 64
    hidden: int = 256
    n_blocks: int = 4
    out_features: int = 10


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(cfg.in_features, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg.hidden) for _ in range(cfg.n_blocks))
        self.head = nn.Linear(2 * cfg.hidden, cfg.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = torch.relu(self.proj(x))
        h = h0
        for block in self.blocks:
            h = block(h)
        return self.head(torch.cat([h, h0], dim=-1))


def build(cfg: MLPConfig) -> nn.Module:
    return MLP(cfg)


def example_inputs(cfg: MLPConfig, batch_size: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    del seq_len  # the MLP has no sequence dimension
    return (torch.randn(batch_size, cfg.in_features),)
