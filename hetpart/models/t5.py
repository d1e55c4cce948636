"""zoo:t5: a T5-style encoder-decoder with relative position bias.

Encoder: bidirectional self-attention; decoder: causal self-attention and
cross-attention to the encoder's output. Both stacks use RMS LayerNorm (T5's),
unscaled attention, ReLU feed-forward layers, and a relative position bias
(T5's log-spaced buckets) computed in the forward by the first layer of each
stack and added in every layer. The LM head is tied to the shared embedding and
rescaled by dim**-0.5. Two inputs: encoder token ids and decoder token ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hetpart.models.llama import RMSNorm


@dataclass
class T5Config:
    vocab_size: int = 2048
    dim: int = 256
    n_layers: int = 3  # per stack
    n_heads: int = 8
    d_ff: int = 1024
    num_buckets: int = 32
    max_distance: int = 128
    norm_eps: float = 1e-6


def relative_position_bucket(relative_position: torch.Tensor, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """T5's bucket of each (key - query) offset: exact for small offsets, log-spaced up to max_distance."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log_ratio * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class Attention(nn.Module):
    def __init__(self, cfg: T5Config, bidirectional: bool, has_bias: bool) -> None:
        super().__init__()
        self.n_heads, self.cfg, self.bidirectional = cfg.n_heads, cfg, bidirectional
        self.q = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.k = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.v = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.o = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.relative_attention_bias = nn.Embedding(cfg.num_buckets, cfg.n_heads) if has_bias else None

    def position_bias(self, q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
        """[1, heads, q_len, k_len] additive bias (a causal mask included for the decoder)."""
        assert self.relative_attention_bias is not None
        rel = torch.arange(k_len, device=device)[None, :] - torch.arange(q_len, device=device)[:, None]
        buckets = relative_position_bucket(rel, self.bidirectional, self.cfg.num_buckets, self.cfg.max_distance)
        bias = self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)
        if not self.bidirectional:
            bias = bias.masked_fill(rel > 0, torch.finfo(bias.dtype).min)
        return bias

    def forward(self, x: torch.Tensor, kv: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        b, t, c = x.shape
        s = kv.shape[1]
        q = self.q(x).view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)
        k = self.k(kv).view(b, s, self.n_heads, c // self.n_heads).transpose(1, 2)
        v = self.v(kv).view(b, s, self.n_heads, c // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)  # T5 does not scale
        return self.o(y.transpose(1, 2).reshape(b, t, c))


class FeedForward(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.wi = nn.Linear(cfg.dim, cfg.d_ff, bias=False)
        self.wo = nn.Linear(cfg.d_ff, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(F.relu(self.wi(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: T5Config, has_bias: bool) -> None:
        super().__init__()
        self.norm1 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, bidirectional=True, has_bias=has_bias)
        self.norm2 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ff = FeedForward(cfg)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, bias)
        return x + self.ff(self.norm2(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: T5Config, has_bias: bool) -> None:
        super().__init__()
        self.norm1 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg, bidirectional=False, has_bias=has_bias)
        self.norm2 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.cross_attn = Attention(cfg, bidirectional=True, has_bias=False)
        self.norm3 = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ff = FeedForward(cfg)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.self_attn(h, h, bias)
        x = x + self.cross_attn(self.norm2(x), memory, None)
        return x + self.ff(self.norm3(x))


class T5(nn.Module):
    def __init__(self, cfg: T5Config) -> None:
        super().__init__()
        self.dim = cfg.dim
        self.shared = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.encoder = nn.ModuleList(EncoderLayer(cfg, has_bias=i == 0) for i in range(cfg.n_layers))
        self.encoder_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.decoder = nn.ModuleList(DecoderLayer(cfg, has_bias=i == 0) for i in range(cfg.n_layers))
        self.decoder_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.shared.weight  # tied, as in the original T5

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
        """[B, S] encoder ids, [B, T] decoder ids -> logits [B, T, vocab]."""
        s, t = input_ids.shape[1], decoder_input_ids.shape[1]
        x = self.shared(input_ids)
        bias = self.encoder[0].attn.position_bias(s, s, input_ids.device)
        for layer in self.encoder:
            x = layer(x, bias)
        memory = self.encoder_norm(x)
        y = self.shared(decoder_input_ids)
        bias = self.decoder[0].self_attn.position_bias(t, t, decoder_input_ids.device)
        for layer in self.decoder:
            y = layer(y, memory, bias)
        return self.lm_head(self.decoder_norm(y) * self.dim**-0.5)


def build(cfg: T5Config) -> nn.Module:
    return T5(cfg)


def example_inputs(cfg: T5Config, batch_size: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, cfg.vocab_size, (batch_size, seq_len)),
            torch.randint(0, cfg.vocab_size, (batch_size, seq_len)))
