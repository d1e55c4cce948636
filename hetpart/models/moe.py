"""zoo:moe: a decoder whose MLPs are top-2-routed mixtures of experts.

Every block's MLP is `n_experts` SwiGLU experts behind a linear router; each
token goes to its `top_k` highest-scoring experts, weighted by their
renormalized softmax scores (Mixtral's routing).

NOTE [dense expert dispatch]
Sparse dispatch (gather the tokens routed to each expert, run it on them,
scatter back) makes every expert's input shape depend on the router's values,
which torch.export cannot trace without data-dependent sizes. So every expert
runs on every token, and the top-k weights are scattered into a dense
[B, T, n_experts] gate matrix that is zero for unselected experts; the output is
the gate-weighted sum of the experts. The numbers equal sparse dispatch; the
FLOPs are n_experts / top_k times those of sparse dispatch, and the cost passes
count what this graph computes. Each expert stays a separate branch, so the
partitioner may place experts of one layer on different stages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hetpart.models.llama import FeedForward, Llama, RMSNorm
from hetpart.models.llama import example_inputs as llama_example_inputs
from hetpart.models.llama import Attention as LlamaAttention


@dataclass
class MoEConfig:
    vocab_size: int = 2048
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 4
    ffn_hidden: int = 512  # per expert
    n_experts: int = 4
    top_k: int = 2
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5


class MoEFeedForward(nn.Module):
    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.top_k = cfg.top_k
        self.router = nn.Linear(cfg.dim, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(cfg) for _ in range(cfg.n_experts))  # type: ignore[arg-type]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """See NOTE [dense expert dispatch]."""
        probs = F.softmax(self.router(x), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        gates = torch.zeros_like(probs).scatter(-1, chosen, weights)  # [B, T, n_experts], top_k nonzero per token
        out = gates[..., 0:1] * self.experts[0](x)
        for e in range(1, len(self.experts)):
            out = out + gates[..., e:e + 1] * self.experts[e](x)
        return out


class Block(nn.Module):
    def __init__(self, cfg: MoEConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = LlamaAttention(cfg)  # type: ignore[arg-type]
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.moe = MoEFeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.moe(self.ffn_norm(x))


class MoETransformer(Llama):
    def __init__(self, cfg: MoEConfig) -> None:
        if cfg.top_k > cfg.n_experts:
            from hetpart.errors import HetpartError

            raise HetpartError(f"moe: top_k {cfg.top_k} is more than n_experts {cfg.n_experts}")
        super().__init__(cfg, block=Block)  # type: ignore[arg-type]


def build(cfg: MoEConfig) -> nn.Module:
    return MoETransformer(cfg)


# Token ids fitting vocab_size and max_seq_len, as for the Llama model.
example_inputs = llama_example_inputs
