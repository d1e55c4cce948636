"""Gradient sync across stages that hold a weight at different tensor-parallel degrees: the slices and their groups.

Torch-free: the cost (`grad_sync_ns` in pipelines.py, over a problem carrying a `TPSyncLayout`) and the
manifest's weights groups (codegen/tp.py) both take their groups from `weight_slices`.

NOTE [mixed-degree gradient sync]
Stages of different TP degrees (1, 2, 4, 8: each divides the next) may hold one weight: data-parallel
pipelines at different degrees, or a tied embedding and LM head in stages of different degrees. A stage
of degree t either splits the weight (`split`: its dim and the fused weight's chunks, one `WeightShard`)
or replicates it (each of its t ranks holds it whole, with an equal, whole gradient). The gradient is
viewed as `of` equal slices, `of` the largest degree of a stage that splits it (1 where none does):
within each of the `chunks` equal parts along the dim, `of` equal pieces, so rank j of a degree-t stage
that splits it holds slices j*(of/t) .. (j+1)*(of/t)-1 (`shard_tensor` at t is the union of those at
`of`: chunk's equal halves are unions of its equal quarters). Slice s is summed by one all-reduce over
the ranks holding it: from each splitting stage its one rank holding s, from each replicating stage
every rank, which first divides its whole gradient by its degree t (t equal copies add up to one), so
the sum is the weight's gradient over every use; each slice is all-reduced once, and a degree-t rank
of a splitting stage joins of/t of them. The split dims must agree: every stage that splits the weight
splits it along the same dim with the same chunks (one sharding pass, `passes/tensor_parallel.py`, per
degree: heads, vocab and columns are split alike at every degree), else `weight_slices` refuses with
the stages' splits; that each chunk divides in `of` pieces is checked by codegen on the tensor's shape.
Cost: each slice is `whole / of` bytes (the whole weight where `of` is 1); slices over the same ranks go
in one bucket (one all-reduce), and a rank's time is the sum of its buckets' ring all-reduces, priced as
NOTE [gradient sync] prices a ring (the slowest link it crosses), the step waiting for the slowest rank.
With one degree everywhere the lanes of NOTE [tensor-parallel gradient sync] stay (their replicated
weights summed per TP index, no division); this is used where the degrees differ.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hetpart.errors import HetpartError


@dataclass(frozen=True)
class TPSyncLayout:
    """What NOTE [mixed-degree gradient sync] needs of a problem whose slots have several degrees: each slot
    type key's degree (absent: 1), what each degree's sharding splits, and each weight's whole bytes."""

    degree_of_type: dict[str, int]  # slot type key ("cpu/tp2") -> its degree
    split: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)  # degree -> weight -> (dim, chunks)
    whole_bytes: dict[str, int] = field(default_factory=dict)  # weight -> its bytes unsplit

    def to_json(self) -> dict:
        return {"degree_of_type": self.degree_of_type,
                "split": {str(t): {w: list(s) for w, s in ws.items()} for t, ws in self.split.items()},
                "whole_bytes": self.whole_bytes}

    @staticmethod
    def from_json(data: dict) -> TPSyncLayout:
        return TPSyncLayout(dict(data["degree_of_type"]),
                            {int(t): {w: (s[0], s[1]) for w, s in ws.items()} for t, ws in data["split"].items()},
                            dict(data["whole_bytes"]))


@dataclass(frozen=True)
class HeldBy:
    """One stage holding a weight: its TP ranks in TP-index order, and its split (dim, chunks), None: replicated."""

    ranks: tuple[Hashable, ...]
    split: tuple[int, int] | None = None
    where: str = ""  # the stage, in words, for errors


@dataclass(frozen=True)
class WeightSlice:
    """Slice `index` of `of` of a weight's gradient (NOTE [mixed-degree gradient sync]) and the ranks summing it."""

    weight: str
    index: int
    of: int
    split: tuple[int, int] | None  # the dim and chunks the slices are taken along (None: of == 1, the whole)
    ranks: tuple[Hashable, ...]


def held_by(stages: Iterable[tuple[Sequence[Hashable], Iterable[str], Mapping[str, Mapping[str, int]], str]]
            ) -> dict[str, list[HeldBy]]:
    """Each weight -> the stages holding it, in the order of `stages`: each its ranks (TP order), the weights its
    ranks hold, its split weights' {"dim", "chunks"} and its name for errors; what `weight_slices` takes (the mesh
    codegen writes and the check `hetpart run` makes of it, NOTE [mixed-degree gradient sync]).

        >>> held_by([((0, 1), ["w", "n"], {"w": {"dim": 0, "chunks": 1}}, "stage 0"), ((2,), ["w"], {}, "stage 1")])
        {'n': [HeldBy(ranks=(0, 1), split=None, where='stage 0')], 'w': [HeldBy(ranks=(0, 1), split=(0, 1), \
where='stage 0'), HeldBy(ranks=(2,), split=None, where='stage 1')]}
    """
    held: dict[str, list[HeldBy]] = {}
    for ranks, weights, split, where in stages:
        for w in sorted(weights):
            spec = split.get(w)
            held.setdefault(w, []).append(HeldBy(tuple(ranks), (spec["dim"], spec["chunks"]) if spec else None, where))
    return held


def weight_slices(held: Mapping[str, Sequence[HeldBy]]) -> list[WeightSlice]:
    """NOTE [mixed-degree gradient sync]: each slice of each weight held by two or more stages, with its ranks (in
    the order of `held`'s stages, each stage's in TP order), weights in sorted order. Raises where two stages
    split one weight along different dims or chunks.

        >>> [(s.index, s.ranks) for s in weight_slices({"w": [HeldBy((0, 1), (0, 1)), HeldBy((2,))]})]
        [(0, (0, 2)), (1, (1, 2))]
        >>> [(s.index, s.ranks) for s in weight_slices({"n": [HeldBy((0, 1)), HeldBy((2,))], "b": [HeldBy((3, 4))]})]
        [(0, (0, 1, 2))]
    """
    out = []
    for w in sorted(held):
        stages = held[w]
        if len(stages) < 2:  # one stage's ranks: its split parts are its own, its replicated copies equal
            continue
        splits = sorted({h.split for h in stages if h.split is not None})
        if len(splits) > 1:
            raise HetpartError(
                f"the plan's stages split {w!r} in different ways ("
                + "; ".join(f"{h.where or 'a stage'}: dim {h.split[0]}, {h.split[1]} chunk(s)" for h in stages
                            if h.split is not None)
                + "), so its gradient's shards do not line up across them: give those machines one "
                "--tensor-parallel degree, or leave the weight's stages at one degree")
        of = max((len(h.ranks) for h in stages if h.split is not None), default=1)
        for h in stages:
            if h.split is not None and of % len(h.ranks):
                raise HetpartError(f"{w!r}: a stage splitting it in {len(h.ranks)} beside one splitting it in {of}; "
                                   "tensor-parallel degrees must divide each other (1, 2, 4, 8)")
        for s in range(of):
            ranks: list[Hashable] = []
            for h in stages:
                ranks += [h.ranks[s // (of // len(h.ranks))]] if h.split is not None else list(h.ranks)
            if len(ranks) > 1:
                out.append(WeightSlice(w, s, of, splits[0] if splits else None, tuple(ranks)))
    return out


def slice_bytes(whole: int, of: int) -> int:
    """One slice's bytes: `whole` in `of` equal slices, rounded up (NOTE [mixed-degree gradient sync])."""
    return -(-whole // max(1, of))


def slice_buckets(slices: Sequence[WeightSlice]) -> dict[tuple[Hashable, ...], list[WeightSlice]]:
    """The slices summed over the same ranks, together: one all-reduce each (NOTE [mixed-degree gradient sync])."""
    out: dict[tuple[Hashable, ...], list[WeightSlice]] = {}
    for s in slices:
        out.setdefault(s.ranks, []).append(s)
    return out


__all__ = ["HeldBy", "TPSyncLayout", "WeightSlice", "held_by", "slice_buckets", "slice_bytes", "weight_slices"]
