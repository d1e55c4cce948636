"""zoo:lstm: a stacked LSTM language model with its time steps unrolled.

Token embedding, `n_layer` LSTM layers of `nn.LSTMCell` stepped in a Python
loop over the (static) sequence length, and a linear LM head on every step's
output. Unrolling turns the recurrence into a plain DAG of cell steps (one
gate matmul pair per layer per step), so the partitioner can cut between layers
or between time steps; the hidden and cell states are the values that cross
cuts. The initial states are zeros made from the batch size in the forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class LSTMConfig:
    vocab_size: int = 2048
    embed_dim: int = 256
    hidden: int = 256
    n_layer: int = 2


class LSTMLanguageModel(nn.Module):
    def __init__(self, cfg: LSTMConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.embed_dim)
        self.cells = nn.ModuleList(
            nn.LSTMCell(cfg.embed_dim if i == 0 else cfg.hidden, cfg.hidden) for i in range(cfg.n_layer)
        )
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx: [B, T] token ids -> logits [B, T, vocab]."""
        x = self.embed(idx)
        steps = [x[:, t] for t in range(idx.shape[1])]
        for cell in self.cells:
            h = x.new_zeros(x.shape[0], cell.hidden_size)
            c = torch.zeros_like(h)
            outputs = []
            for x_t in steps:
                h, c = cell(x_t, (h, c))
                outputs.append(h)
            steps = outputs
        return self.head(torch.stack(steps, dim=1))


def build(cfg: LSTMConfig) -> nn.Module:
    return LSTMLanguageModel(cfg)


def example_inputs(cfg: LSTMConfig, batch_size: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    return (torch.randint(0, cfg.vocab_size, (batch_size, seq_len)),)
