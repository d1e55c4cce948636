"""Which part of each full tensor a checkpoint's rank holds, and the slices a new rank reads to assemble its own.

NOTE [checkpoint slices]
A rank of a tensor-parallel stage holds a shard of each split weight (NOTE [tensor-parallel stages] in
codegen/tp.py): `shard_tensor`'s part, the rank's `1/degree` of each of the weight's `chunks` equal parts
along `dim`. Its checkpoint part (rank<k>.json, NOTE [checkpoint layout]) records, for every tensor it wrote
(weights and optimizer state), a `Layout`: the full tensor's shape and either "replicated" (the rank holds
all of it) or the split dim and the pieces [start, stop) of the full tensor along it, concatenated in the
rank's tensor in that order (a fused q/k/v weight: one piece per chunk). An optimizer state tensor of a
weight's shape (SGD's momentum_buffer, Adam's exp_avg and exp_avg_sq) lies like its weight; a scalar
(Adam's step) is replicated; any other shape of a split weight's state is refused when it is written.
Resume: a new rank needs, per tensor, a `Layout` of the same full shape (all of it, or its shard under the
new plan: any degree, any dim). `plan_reads` cuts each piece it needs into the cells of the grid that every
old piece's bounds make, and reads each cell from the first old rank (in the order `weight_sources` ranks
them: same device, same machine, first) whose piece holds it: an old slice, `safe_open(...).get_slice`,
copied to the new rank's tensor at its place. Nothing reads a full tensor for a new rank that needs a shard;
a cell no old rank holds is an error naming the tensor, before any rank starts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hetpart.errors import HetpartError
from hetpart.shards import WeightShard, shard_tensor, split_full_shape

Box = tuple[tuple[int, int], ...]  # [lo, hi) per dim of the full tensor


@dataclass(frozen=True)
class Layout:
    """Where a rank's tensor lies in the full tensor (NOTE [checkpoint slices])."""

    shape: tuple[int, ...]  # the full tensor's
    dim: int | None = None  # None: the rank holds all of it (replicated)
    pieces: tuple[tuple[int, int], ...] = ()  # [start, stop) along `dim`, in the rank's order

    def local_shape(self) -> tuple[int, ...]:
        """The shape of the rank's tensor."""
        if self.dim is None:
            return self.shape
        return tuple(sum(b - a for a, b in self.pieces) if d == self.dim else n for d, n in enumerate(self.shape))

    def boxes(self) -> list[tuple[Box, int]]:
        """Each piece's box in the full tensor and its offset along `dim` in the rank's tensor."""
        if self.dim is None:
            return [(tuple((0, n) for n in self.shape), 0)]
        out, offset = [], 0
        for a, b in self.pieces:
            out.append((tuple((a, b) if d == self.dim else (0, n) for d, n in enumerate(self.shape)), offset))
            offset += b - a
        return out

    def to_json(self) -> dict[str, Any]:
        """rank<k>.json's record."""
        if self.dim is None:
            return {"shape": list(self.shape), "replicated": True}
        return {"shape": list(self.shape), "dim": self.dim, "slices": [list(p) for p in self.pieces]}

    @staticmethod
    def from_json(raw: Any, where: str) -> Layout:
        """A record `to_json` wrote, checked: an error naming `where` if it is not one."""
        shape = raw.get("shape") if isinstance(raw, dict) else None
        if not (isinstance(shape, list) and all(isinstance(n, int) and n >= 0 for n in shape)):
            raise HetpartError(f"{where}: a tensor's layout needs its full shape (a list of sizes); the checkpoint "
                               "was edited or damaged: resume from another one")
        if raw.get("replicated") is True:
            return Layout(tuple(shape))
        dim, pieces = raw.get("dim"), raw.get("slices")
        if not (isinstance(dim, int) and 0 <= dim < len(shape) and isinstance(pieces, list) and pieces
                and all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) for x in p)
                        and 0 <= p[0] < p[1] <= shape[dim] for p in pieces)):
            raise HetpartError(f"{where}: a split tensor's layout needs a dim of its shape {shape} and slices "
                               "[start, stop) inside it; the checkpoint was edited or damaged: resume from another one")
        return Layout(tuple(shape), dim, tuple((a, b) for a, b in pieces))


def shard_layout(shape: tuple[int, ...], shard: dict[str, int] | None) -> Layout:
    """The layout of TP rank `shard["rank"]` of `shard["degree"]`'s part of a full tensor of `shape` split on
    `shard["dim"]` in `shard["chunks"]` (None: replicated), derived from `shard_tensor` itself."""
    if shard is None:
        return Layout(tuple(shape))
    dim = shard["dim"]
    index = shard_tensor(torch.arange(shape[dim]), WeightShard(0, shard["chunks"]), shard["rank"],
                         shard["degree"]).tolist()
    pieces: list[list[int]] = []
    for i in index:
        if pieces and pieces[-1][1] == i:
            pieces[-1][1] = i + 1
        else:
            pieces.append([i, i + 1])
    return Layout(tuple(shape), dim, tuple((a, b) for a, b in pieces))


def saved_layouts(tensors: dict[str, torch.Tensor], shards: dict[str, dict[str, int]]) -> dict[str, Layout]:
    """The layout of each tensor a rank writes ("weight/<fqn>", "optimizer/<fqn>/<key>"), its split weights'
    (`shards`: FQN -> dim, chunks, rank, degree; runtime/tp.py `weight_shards`) from their shard's shape."""
    out: dict[str, Layout] = {}
    for key, t in tensors.items():
        kind, rest = key.split("/", 1)
        fqn = rest if kind == "weight" else rest.rsplit("/", 1)[0]
        shard = shards.get(fqn)
        if kind == "weight" or shard is None or t.dim() == 0:
            shape = split_full_shape(tuple(t.shape), shard if kind == "weight" else None)
            out[key] = shard_layout(shape, shard if t.dim() else None)
            if out[key].local_shape() != tuple(t.shape):
                raise HetpartError(f"checkpoint: {fqn}'s shard is {list(t.shape)}, not a 1/{shard['degree']} "
                                   f"part on dim {shard['dim']}")
    for key, t in tensors.items():
        if key not in out:  # a split weight's optimizer state: it lies like the weight
            fqn = key.split("/", 1)[1].rsplit("/", 1)[0]
            weight = out.get(f"weight/{fqn}")
            if weight is None or weight.local_shape() != tuple(t.shape):
                raise HetpartError(f"checkpoint: the optimizer state {key} is {list(t.shape)}, its weight's shard "
                                   f"{list(weight.local_shape()) if weight else '(absent)'}: hetpart checkpoints "
                                   "split weights' state of the weight's shape, or scalars")
            out[key] = weight
    return out


def needed_layout(key: str, old: Layout, shards: dict[str, dict[str, int]], weight_shape: tuple[int, ...]) -> Layout:
    """What a new rank needs of `key`, whose old layout is `old` (its full shape): its shard where the new plan
    splits the weight (of full shape `weight_shape`; an optimizer state of that shape too), else all of it."""
    kind, rest = key.split("/", 1)
    fqn = rest if kind == "weight" else rest.rsplit("/", 1)[0]
    shard = shards.get(fqn)
    if shard is None or old.shape != weight_shape:
        return Layout(old.shape)
    return shard_layout(old.shape, shard)


@dataclass(frozen=True)
class SliceRead:
    """One copy of a new rank's tensor: `src` of an old rank's tensor in `file` to `dst` of the new one."""

    file: str
    src: tuple[slice, ...]
    dst: tuple[slice, ...]


def _contains(box: Box, cell: Box) -> bool:
    return all(a <= c and d <= b for (a, b), (c, d) in zip(box, cell))


def plan_reads(key: str, need: Layout, holders: list[tuple[str, Layout]]) -> list[SliceRead]:
    """The slices that assemble `need` from `holders` (file, its layout), earlier holders first for each cell
    (NOTE [checkpoint slices]); an error if a holder's full shape differs or a cell is held by none."""
    for file, layout in holders:
        if layout.shape != need.shape:
            raise HetpartError(f"checkpoint: {key} is {list(layout.shape)} in {file}, the new rank's "
                               f"{list(need.shape)}: a checkpoint of another model")
    pieces = [(file, box, off, layout.dim) for file, layout in holders for box, off in layout.boxes()]
    reads = []
    for want, want_off in need.boxes():
        cuts = [sorted({a, b} | {x for _, box, _, _ in pieces for x in box[d] if a < x < b})
                for d, (a, b) in enumerate(want)]
        for cell in itertools.product(*[list(zip(c, c[1:])) for c in cuts]):
            if any(a == b for a, b in cell):
                continue  # an empty dim: nothing to read
            found = next((p for p in pieces if _contains(p[1], cell)), None)
            if found is None:
                raise HetpartError(f"checkpoint: no old rank holds {key}[{', '.join(f'{a}:{b}' for a, b in cell)}], "
                                   "which a new rank needs: the checkpoint is not of this model")
            file, box, off, dim = found
            src = tuple(slice(a - lo + (off if d == dim else 0), b - lo + (off if d == dim else 0))
                        for d, ((a, b), (lo, _)) in enumerate(zip(cell, box)))
            dst = tuple(slice(a - lo + (want_off if d == need.dim else 0), b - lo + (want_off if d == need.dim else 0))
                        for d, ((a, b), (lo, _)) in enumerate(zip(cell, want)))
            reads.append(SliceRead(file, src, dst))
    return reads


def assemble(need: Layout, reads: list[SliceRead], get_slice: Callable[[str], Any]) -> torch.Tensor:
    """The new rank's tensor: each read's `src` of `get_slice(file)` (a safetensors slice, or a tensor) copied
    to its `dst`."""
    if not need.shape:
        return get_slice(reads[0].file)[()] if reads else torch.empty(())
    parts = [(r.dst, get_slice(r.file)[r.src]) for r in reads]
    out = torch.empty(need.local_shape(), dtype=parts[0][1].dtype if parts else torch.float32)
    for dst, part in parts:
        out[dst] = part
    return out
