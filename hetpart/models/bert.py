"""zoo:bert: a BERT-style encoder with a masked-LM head.

Word, position and token-type embeddings, post-LayerNorm encoder layers with
bidirectional self-attention under a padding mask, and the MLM head (dense,
GELU, LayerNorm, decoder tied to the word embeddings, plus a bias). Three
inputs: token ids, token-type ids and the attention mask (1 = real token,
0 = padding); the mask becomes an additive bias read by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class BertConfig:
    vocab_size: int = 2048
    hidden: int = 256
    n_layers: int = 4
    n_heads: int = 8
    intermediate: int = 1024
    max_position: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(self.query(x)), heads(self.key(x)), heads(self.value(x)),
                                           attn_mask=mask_bias)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class Layer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.intermediate = nn.Linear(cfg.hidden, cfg.intermediate)
        self.output = nn.Linear(cfg.intermediate, cfg.hidden)
        self.output_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.attention(x, mask_bias))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class BertForMaskedLM(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.position_embeddings = nn.Embedding(cfg.max_position, cfg.hidden)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden)
        self.embeddings_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layers))
        self.head_dense = nn.Linear(cfg.hidden, cfg.hidden)
        self.head_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.decoder = nn.Linear(cfg.hidden, cfg.vocab_size)
        self.decoder.weight = self.word_embeddings.weight  # tied, as in BERT

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor
                ) -> torch.Tensor:
        """[B, T] ids, token types and 0/1 mask -> MLM logits [B, T, vocab]."""
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos) + self.token_type_embeddings(token_type_ids)
        x = self.embeddings_norm(x)
        # [B, 1, 1, T]: 0 where a key is a real token, a large negative number where it is padding
        mask_bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask_bias)
        return self.decoder(self.head_norm(F.gelu(self.head_dense(x))))


def build(cfg: BertConfig) -> nn.Module:
    return BertForMaskedLM(cfg)


def example_inputs(cfg: BertConfig, batch_size: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    if seq_len > cfg.max_position:
        from hetpart.errors import HetpartError

        raise HetpartError(f"--seq-len {seq_len} is longer than max_position {cfg.max_position}; "
                           f"use --seq-len <= {cfg.max_position} or --set max_position={seq_len}")
    ids = torch.randint(0, cfg.vocab_size, (batch_size, seq_len))
    types = (torch.arange(seq_len) >= seq_len // 2).long().expand(batch_size, seq_len).contiguous()
    lengths = torch.randint(1, seq_len + 1, (batch_size,))  # every sequence has at least one real token
    mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
    return ids, types, mask
