"""zoo:llama: a Llama-style decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention).

Pre-RMSNorm blocks, causal attention with rotary position embeddings whose
cos/sin tables are computed in the forward from the positions (no buffers), and
`n_kv_heads` < `n_heads` key/value heads shared by groups of query heads (GQA),
a SwiGLU MLP and an untied LM head. `zoo:llama-7b` and `zoo:llama-70b` carry the
Llama-2 dimensions, `zoo:llama-405b` Llama-3.1-405B's; they are meta-only (see `ZooModel.meta_only`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaConfig:
    vocab_size: int = 2048
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 2
    ffn_hidden: int = 688
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dtype: str = "float32"  # of the weights (and so the activations): float32, bfloat16 or float16


@dataclass
class Llama7BConfig(LlamaConfig):
    """Llama-2-7B: 32 layers, 32 heads (no GQA), 4096 wide."""

    vocab_size: int = 32000
    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 32
    ffn_hidden: int = 11008
    max_seq_len: int = 4096


@dataclass
class Llama70BConfig(LlamaConfig):
    """Llama-2-70B: 80 layers, 64 query heads sharing 8 key/value heads, 8192 wide."""

    vocab_size: int = 32000
    dim: int = 8192
    n_layers: int = 80
    n_heads: int = 64
    n_kv_heads: int = 8
    ffn_hidden: int = 28672
    max_seq_len: int = 4096


@dataclass
class Llama405BConfig(LlamaConfig):
    """Llama-3.1-405B's shape: 126 layers, 16384 wide, 128 query heads sharing 8 key/value heads,
    a 53248-wide SwiGLU and a 128,256-token vocabulary."""

    vocab_size: int = 128256
    dim: int = 16384
    n_layers: int = 126
    n_heads: int = 128
    n_kv_heads: int = 8
    ffn_hidden: int = 53248
    max_seq_len: int = 4096
    rope_theta: float = 500000.0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_tables(seq_len: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each [seq_len, head_dim], for positions 0..seq_len-1."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.n_heads // self.n_kv_heads  # each key/value head serves `groups` query heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)  # gate
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_hidden, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """The decoder; `block` builds each layer (the MoE model swaps in its own)."""

    def __init__(self, cfg: LlamaConfig, block: type[nn.Module] | None = None) -> None:
        super().__init__()
        if cfg.dim % cfg.n_heads or cfg.n_heads % cfg.n_kv_heads:
            from hetpart.errors import HetpartError

            raise HetpartError(f"llama: dim {cfg.dim} must divide by n_heads {cfg.n_heads}, "
                               f"and n_heads by n_kv_heads {cfg.n_kv_heads}")
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList((block or Block)(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens: [B, T] -> logits [B, T, vocab]."""
        cos, sin = rope_tables(tokens.shape[1], self.cfg.dim // self.cfg.n_heads, self.cfg.rope_theta, tokens.device)
        h = self.tok_embeddings(tokens)
        cos, sin = cos.to(h.dtype), sin.to(h.dtype)  # tables in fp32, applied in the weights' dtype
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build(cfg: LlamaConfig) -> nn.Module:
    if cfg.dtype not in DTYPES:
        from hetpart.errors import HetpartError

        raise HetpartError(f"llama: dtype '{cfg.dtype}' is not one of {', '.join(DTYPES)}")
    return Llama(cfg).to(DTYPES[cfg.dtype])


def example_inputs(cfg: LlamaConfig, batch_size: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    if seq_len > cfg.max_seq_len:
        from hetpart.errors import HetpartError

        raise HetpartError(f"--seq-len {seq_len} is longer than max_seq_len {cfg.max_seq_len}; "
                           f"use --seq-len <= {cfg.max_seq_len} or --set max_seq_len={seq_len}")
    return (torch.randint(0, cfg.vocab_size, (batch_size, seq_len)),)
