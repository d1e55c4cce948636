"""zoo:resnet: a ResNet-style CNN (basic blocks, BatchNorm, skip connections).

A stem convolution, `n_stages` stages of `blocks_per_stage` basic blocks (two
3x3 convolutions with BatchNorm, and a skip connection; the first block of every
stage but the first halves the resolution and doubles the channels, with a
strided 1x1 projection on the skip), global average pooling and a linear
classifier. BatchNorm runs in eval mode, so its running statistics are buffers
that stages must carry alongside the parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ResNetConfig:
    in_channels: int = 3
    image_size: int = 32
    base_width: int = 32  # channels of the first stage; doubled at every later stage
    n_stages: int = 3
    blocks_per_stage: int = 2
    num_classes: int = 10


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))
            if stride != 1 or c_in != c_out else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, cfg: ResNetConfig) -> None:
        super().__init__()
        w = cfg.base_width
        self.stem = nn.Sequential(nn.Conv2d(cfg.in_channels, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU())
        blocks = []
        c_in = w
        for s in range(cfg.n_stages):
            c_out = w * 2**s
            for b in range(cfg.blocks_per_stage):
                blocks.append(BasicBlock(c_in, c_out, stride=2 if s > 0 and b == 0 else 1))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c_in, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build(cfg: ResNetConfig) -> nn.Module:
    model = ResNet(cfg)
    # Non-trivial running statistics, so a stage that lost a BatchNorm buffer shows up in the numbers.
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=g))
            m.running_var.copy_(1 + 0.1 * torch.rand(m.num_features, generator=g))
    return model


def example_inputs(cfg: ResNetConfig, batch_size: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    del seq_len  # images have no sequence dimension
    return (torch.randn(batch_size, cfg.in_channels, cfg.image_size, cfg.image_size),)
