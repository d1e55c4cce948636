"""zoo:glm: a generalized linear model over wide categorical and dense features.

Logistic regression as recommendation and ads systems write it: each
categorical feature is a bag of ids (several ids per example, e.g. the pages a
user visited) whose per-id weights are summed by an `nn.EmbeddingBag`; dense
features get one weight each. The logit is the sum of all of them plus a bias,
and the output is the click probability. Optionally (`embed_dim > 0`) a
factorization-machine term adds pairwise interactions of the features' low-rank
embeddings, as in a wide-and-deep or FM model.

What it exercises: many small weight tables read once each (the weight memory
dwarfs the compute), int64 id inputs, `_embedding_bag`, and a very wide, shallow
graph with many parallel branches that join at one sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class GLMConfig:
    n_categorical: int = 8  # categorical features, one embedding table each
    vocab_size: int = 1000  # ids per categorical feature
    bag_size: int = 4  # ids per example per feature (multi-hot)
    n_dense: int = 13  # dense (real-valued) features
    embed_dim: int = 8  # rank of the factorization-machine interaction term; 0 turns it off


class GLM(nn.Module):
    def __init__(self, cfg: GLMConfig) -> None:
        super().__init__()
        self.wide = nn.ModuleList(nn.EmbeddingBag(cfg.vocab_size, 1, mode="sum") for _ in range(cfg.n_categorical))
        self.dense = nn.Linear(cfg.n_dense, 1)
        self.factors = (
            nn.ModuleList(nn.EmbeddingBag(cfg.vocab_size, cfg.embed_dim, mode="mean") for _ in range(cfg.n_categorical))
            if cfg.embed_dim > 0 else None
        )

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        """ids: [B, n_categorical, bag_size] int64; dense: [B, n_dense] -> probability [B, 1]."""
        logit = self.dense(dense)
        for f, table in enumerate(self.wide):
            logit = logit + table(ids[:, f])
        if self.factors is not None:
            v = torch.stack([table(ids[:, f]) for f, table in enumerate(self.factors)], dim=1)  # [B, F, k]
            # FM identity: sum_{i<j} <v_i, v_j> = ((sum_i v_i)^2 - sum_i v_i^2) / 2, summed over k
            pairwise = 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=1, keepdim=True)
            logit = logit + pairwise
        return torch.sigmoid(logit)


def build(cfg: GLMConfig) -> nn.Module:
    return GLM(cfg)


def example_inputs(cfg: GLMConfig, batch_size: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    del seq_len  # no sequence dimension
    ids = torch.randint(0, cfg.vocab_size, (batch_size, cfg.n_categorical, cfg.bag_size))
    return ids, torch.randn(batch_size, cfg.n_dense)
