"""How a tensor-parallel weight is split across its group (NOTE [tensor-parallel stages] in codegen/tp.py): the
split (`WeightShard`), a rank's part of a whole tensor (`shard_tensor`), the whole from every rank's part
(`unshard_tensor`) and the whole shape from one part's (`split_full_shape`).

Here rather than in passes/ or codegen/, whose packages import the partitioner and ortools: a rank of `hetpart run`
slices its checkpoint and gathers its shards for --verify with these, and imports only torch for them
(tests/runtime/test_rank_imports.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WeightShard:
    """How one weight is split across a tensor-parallel group."""

    dim: int  # the dim split in t equal parts: 0 for a column linear's weight and bias, 1 for a row's
    chunks: int = 1  # a fused weight's equal parts along `dim` (q, k, v), each split in t

    def to_json(self) -> dict:
        return {"dim": self.dim, "chunks": self.chunks}


def shard_tensor(tensor: torch.Tensor, shard: WeightShard, rank: int, degree: int) -> torch.Tensor:
    """Rank `rank`'s part of `tensor`: each of its `shard.chunks` equal parts along `shard.dim` split in `degree`.

        >>> shard_tensor(torch.arange(12), WeightShard(0, chunks=3), 1, 2).tolist()
        [2, 3, 6, 7, 10, 11]
    """
    parts = tensor.chunk(shard.chunks, dim=shard.dim)
    return torch.cat([p.chunk(degree, dim=shard.dim)[rank] for p in parts], dim=shard.dim).contiguous()


def unshard_tensor(parts: list[torch.Tensor], shard: WeightShard) -> torch.Tensor:
    """The whole tensor from every rank's part, in rank order (the inverse of `shard_tensor`)."""
    per_rank = [p.chunk(shard.chunks, dim=shard.dim) for p in parts]
    return torch.cat([torch.cat([r[c] for r in per_rank], dim=shard.dim) for c in range(shard.chunks)],
                     dim=shard.dim)


def split_full_shape(shape: tuple[int, ...], split: dict[str, int] | None) -> tuple[int, ...]:
    """The whole tensor's shape, of which a tensor of `shape` is TP rank `split["rank"]`'s part (`shard_tensor`'s:
    `split["degree"]` times as long on `split["dim"]`, NOTE [weight manifests] in codegen/weights.py); `shape` where
    `split` is None."""
    if split is None:
        return tuple(shape)
    return tuple(n * split["degree"] if d == split["dim"] else n for d, n in enumerate(shape))
