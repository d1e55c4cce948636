"""zoo:hgnn: a heterogeneous graph network (R-GCN-style) over a fixed graph.

Two node types (authors and papers) and three relations (author -writes->
paper, paper -cites-> paper, paper -written_by-> author). The graph is fixed
and part of the model: each relation's source and destination node indices are
int64 buffers, and each relation's in-degree of every destination node is a
float buffer. A batch holds B feature sets on that same graph: node features
are [B, nodes, features]. Every layer, for each relation, gathers source
features (`index_select` on dim 1), transforms them with the relation's weight,
sums them into the destination nodes (`index_add` on dim 1), divides by the
in-degree, and adds a self-loop transform; the output classifies every paper.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class HGNNConfig:
    n_authors: int = 64
    n_papers: int = 128
    n_writes: int = 256  # author -> paper edges (the reverse relation has as many)
    n_cites: int = 512  # paper -> paper edges
    in_features: int = 32
    hidden: int = 64
    n_layers: int = 2
    num_classes: int = 8
    graph_seed: int = 0


# relation -> (source type, destination type)
RELATIONS = {"writes": ("author", "paper"), "cites": ("paper", "paper"), "written_by": ("paper", "author")}


def random_graph(cfg: HGNNConfig) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """relation -> (src, dst) int64 index tensors, deterministic for cfg.graph_seed."""
    g = torch.Generator().manual_seed(cfg.graph_seed)
    w_src = torch.randint(0, cfg.n_authors, (cfg.n_writes,), generator=g)
    w_dst = torch.randint(0, cfg.n_papers, (cfg.n_writes,), generator=g)
    c_src = torch.randint(0, cfg.n_papers, (cfg.n_cites,), generator=g)
    c_dst = torch.randint(0, cfg.n_papers, (cfg.n_cites,), generator=g)
    return {"writes": (w_src, w_dst), "cites": (c_src, c_dst), "written_by": (w_dst, w_src)}


class HeteroLayer(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.rel = nn.ModuleDict({r: nn.Linear(d_in, d_out, bias=False) for r in RELATIONS})
        self.self_loop = nn.ModuleDict({t: nn.Linear(d_in, d_out) for t in ("author", "paper")})

    def forward(self, h: dict[str, torch.Tensor], graph: nn.Module) -> dict[str, torch.Tensor]:
        out = {t: self.self_loop[t](x) for t, x in h.items()}
        for r, (src_t, dst_t) in RELATIONS.items():
            src, dst, deg = getattr(graph, f"{r}_src"), getattr(graph, f"{r}_dst"), getattr(graph, f"{r}_deg")
            messages = self.rel[r](h[src_t].index_select(1, src))  # [B, edges, d_out]
            summed = torch.zeros_like(out[dst_t]).index_add(1, dst, messages)  # [B, dst nodes, d_out]
            out[dst_t] = out[dst_t] + summed / deg[:, None]
        return {t: torch.relu(x) for t, x in out.items()}


class Graph(nn.Module):
    """The fixed graph as buffers: `{relation}_src`, `{relation}_dst` and `{relation}_deg`."""

    def __init__(self, cfg: HGNNConfig) -> None:
        super().__init__()
        sizes = {"author": cfg.n_authors, "paper": cfg.n_papers}
        for r, (src, dst) in random_graph(cfg).items():
            self.register_buffer(f"{r}_src", src)
            self.register_buffer(f"{r}_dst", dst)
            deg = torch.bincount(dst, minlength=sizes[RELATIONS[r][1]]).float().clamp(min=1)
            self.register_buffer(f"{r}_deg", deg)


class HGNN(nn.Module):
    def __init__(self, cfg: HGNNConfig) -> None:
        super().__init__()
        # NOTE: not named `graph`: the exported GraphModule's own `graph` attribute would shadow it
        self.topology = Graph(cfg)
        dims = [cfg.in_features] + [cfg.hidden] * cfg.n_layers
        self.layers = nn.ModuleList(HeteroLayer(a, b) for a, b in zip(dims, dims[1:]))
        self.classifier = nn.Linear(cfg.hidden, cfg.num_classes)

    def forward(self, x_author: torch.Tensor, x_paper: torch.Tensor) -> torch.Tensor:
        """[B, authors, F] and [B, papers, F] node features -> paper logits [B, papers, classes]."""
        h = {"author": x_author, "paper": x_paper}
        for layer in self.layers:
            h = layer(h, self.topology)
        return self.classifier(h["paper"])


def build(cfg: HGNNConfig) -> nn.Module:
    return HGNN(cfg)


def example_inputs(cfg: HGNNConfig, batch_size: int, seq_len: int) -> tuple[torch.Tensor, ...]:
    del seq_len  # graphs have no sequence dimension
    return (torch.randn(batch_size, cfg.n_authors, cfg.in_features),
            torch.randn(batch_size, cfg.n_papers, cfg.in_features))
