"""Where each part of the old plan's state lies, as the re-plan's engines read it (NOTE [re-plan by shard]).

NOTE [re-plan by shard]
The re-plan (NOTE [lexicographic re-plan] in replan.py) counts the bytes of *parts*: what one rank of a
stage needs of a weight's state. On a one-device slot that is the weight whole: one part, named as the
weight. On a tensor-parallel slot of degree t (NOTE [tensor-parallel stages] in codegen/tp.py) each rank j
of the group needs a part of its own: its 1/t shard of a weight the sharding splits (`<w>[tp j/t]`, held
by the old ranks of TP index j of the stages that held w: the same 1/t of the full tensor, since a TP
re-plan keeps the degree), or the whole of a replicated weight (`<w>[copy j/t]`, which any old rank that
held w holds). A part's bytes are its rank's state bytes in the TP problem (`state_to_move_bytes`: a
split weight's are already 1/t there, `costs.tp_shard_bytes`). Per part the engines read three things,
which `Holdings` holds:
- `slots[p]`: the problem's slots on which nothing moves: a one-device slot that held p; a TP group whose
  device at p's index held p;
- `machines[p]`: the machines where a surviving device holds p. Any device counts, also one that is in no
  slot of the new problem or sits at another TP index there: it still holds the bytes and sends them
  within its machine;
- `sources[p]`: those surviving devices in the old ranks' order; a move reads from the first one on the
  target's machine, else the first (`replan.stage_moves`); `old[p]`: every old holder, lost ones too (where
  the old plan cut, NOTE [re-plan DP]).
A part no surviving device holds is read from the checkpoint whatever the plan. Where the parts a stage
needs depend on its slot (slots of mixed tensor-parallel degrees: `mixed_holdings`), `Holdings.needed(w, slot)` gives them; every engine reads a stage's parts through it.
`as_holdings` builds the
one-device form from the plain holders (weight -> old devices) every engine took before: one part per
weight, the problem's own devices the only ones alive (a sub-problem's too, as before). The bytes the
runtime then reads are NOTE [checkpoint slices]'s: a new TP rank reads exactly its shard's slices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hetpart.partitioner.costs import held_weight_bytes
from hetpart.partitioner.problem import Problem


def state_to_move_bytes(problem: Problem, weight: str) -> int:
    """Bytes that move with a weight: its value and, in training, its optimizer state (its gradient is
    recomputed): what a run's checkpoint holds of it where the problem has one (NOTE [bytes from a checkpoint] in
    hetpart/replan_checkpoint.py), else as the plan costs it: `held_weight_bytes` less the gradient, which is
    the weight's own size."""
    held = problem.checkpoint_state
    if held is not None and weight in held.value_bytes:
        return held.moved_bytes(weight, problem.weights[weight])
    held = held_weight_bytes(problem, weight)
    grad = problem.weights[weight] if problem.training is not None and weight in problem.training.state_bytes else 0
    return held - grad


@dataclass(frozen=True)
class Holdings:
    """NOTE [re-plan by shard]: each weight's parts and where each part lies."""

    parts: Mapping[str, tuple[str, ...]]  # weight -> its parts (a one-device problem: the weight itself)
    nbytes: Mapping[str, int]  # part -> the bytes that move with it
    slots: Mapping[str, frozenset[str]]  # part -> the problem's slots that hold it: nothing moves there
    machines: Mapping[str, frozenset[str]]  # part -> machines where a surviving device holds it
    sources: Mapping[str, tuple[str, ...]]  # part -> the surviving devices that hold it
    machine: Mapping[str, str]  # surviving device -> its machine
    old: Mapping[str, tuple[str, ...]]  # part -> every old device that held it, lost ones too
    # Mixed degrees (`mixed_holdings`): slot -> its need key, and need key -> weight -> the parts a slot of that key
    # needs; None: every slot needs `parts[w]`.
    need_of_slot: Mapping[str, str] | None = None
    need: Mapping[str, Mapping[str, tuple[str, ...]]] | None = None

    def needed(self, weight: str, slot: str) -> tuple[str, ...]:
        """The parts of `weight` a stage on `slot` needs (NOTE [re-plan by shard]): on a TP-t slot of mixed
        degrees, each rank's 1/t of a weight the sharding splits at t, the whole of others."""
        if self.need is None:
            return self.parts[weight]
        return self.need[self.need_of_slot[slot]][weight]

    def needed_bytes(self, weight: str, slot: str) -> int:
        """The bytes of `weight` (and its optimizer state) a stage on `slot` holds, over its ranks."""
        return sum(self.nbytes[p] for p in self.needed(weight, slot))

    def total_bytes(self) -> int:
        return sum(self.nbytes[p] for ps in self.parts.values() for p in ps)

    def lost_bytes(self, weights: Iterable[str], slots: Iterable[str]) -> int:
        """The least any plan on `slots` reads from the checkpoint: per weight, the parts no surviving device holds,
        on the slot (its need) where they are fewest."""
        keys = {self.need_of_slot[s] for s in slots} if self.need is not None else {None}
        return sum(min(sum(self.nbytes[p] for p in (self.parts[w] if k is None else self.need[k][w])
                           if not self.sources[p]) for k in keys) for w in weights)


def as_holdings(problem: Problem, holders: Mapping[str, tuple[str, ...]] | Holdings) -> Holdings:
    """`holders` (weight -> old devices holding it; those not in `problem` are lost) as Holdings of one part per
    weight; Holdings as they are."""
    if isinstance(holders, Holdings):
        return holders
    machine = {d.name: d.node for d in problem.devices}
    alive = {w: tuple(h for h in holders.get(w, ()) if h in machine) for w in problem.weights}
    return Holdings(parts={w: (w,) for w in problem.weights},
                    nbytes={w: state_to_move_bytes(problem, w) for w in problem.weights},
                    slots={w: frozenset(hs) for w, hs in alive.items()},
                    machines={w: frozenset(machine[h] for h in hs) for w, hs in alive.items()},
                    sources=alive, machine=machine, old={w: tuple(holders.get(w, ())) for w in problem.weights})


@dataclass(frozen=True)
class OldRank:
    """An old rank of a tensor-parallel plan: its device, its TP index and the weights it held."""

    device: str
    index: int
    weights: tuple[str, ...]


def tp_part(weight: str, index: int, degree: int, split: bool) -> str:
    """The name of TP index `index`'s part of `weight` (NOTE [re-plan by shard])."""
    return f"{weight}[{'tp' if split else 'copy'} {index}/{degree}]"


def tp_holdings(problem: Problem, degree: int, slot_devices: Mapping[str, tuple[str, ...]],
                alive: Mapping[str, str], old_ranks: Sequence[OldRank], split: set[str]) -> Holdings:
    """NOTE [re-plan by shard] for a problem whose every slot is a TP group of `degree` (`slot_devices`: slot ->
    its devices in TP order), the old plan's ranks `old_ranks` of the same degree, `split` the weights the
    sharding splits, `alive` every surviving device -> its machine."""
    held: dict[str, list[str]] = {}
    for r in old_ranks:
        for w in r.weights:
            for j in ([r.index] if w in split else range(degree)):  # a replicated weight: every index's copy
                held.setdefault(tp_part(w, j, degree, w in split), []).append(r.device)
    parts, nbytes, slots, machines, sources, old = {}, {}, {}, {}, {}, {}
    for w in problem.weights:
        parts[w] = tuple(tp_part(w, j, degree, w in split) for j in range(degree))
        for j, p in enumerate(parts[w]):
            old[p] = tuple(held.get(p, ()))
            sources[p] = tuple(d for d in old[p] if d in alive)
            nbytes[p] = state_to_move_bytes(problem, w)
            slots[p] = frozenset(s for s, devs in slot_devices.items() if devs[j] in sources[p])
            machines[p] = frozenset(alive[d] for d in sources[p])
    return Holdings(parts, nbytes, slots, machines, sources, dict(alive), old)


@dataclass(frozen=True)
class MixedRank:
    """An old rank of a plan of any degrees: its device, its place (index of degree) in its stage's group, and the
    weights it held, `split` those its stage's degree shards (it holds its 1/degree of them)."""

    device: str
    index: int
    degree: int
    weights: tuple[str, ...]
    split: frozenset[str] = frozenset()


def cells(degree: int, index: int, finest: int) -> range:
    """The cells (1/`finest` shards, `mixed_holdings`) of a weight that rank `index` of a TP-`degree`
    group holds of a weight it splits: shards of the powers of two nest."""
    per = finest // degree
    return range(index * per, (index + 1) * per)


def mixed_holdings(weights: Iterable[str], slot_devices: Mapping[str, tuple[str, ...]], slot_degree: Mapping[str, int],
                   split_at: Mapping[int, set[str]], state_bytes: Mapping[str, int], alive: Mapping[str, str],
                   old_ranks: Sequence[MixedRank], scalar_bytes: Mapping[str, int] | None = None) -> Holdings:
    """NOTE [re-plan by shard] for slots of mixed tensor-parallel degrees:
    `slot_devices` each slot's devices in TP order, `slot_degree` its degree, `split_at` degree -> the weights its
    sharding splits, `state_bytes` each weight's state that moves, unsplit (`state_to_move_bytes`), `alive`
    every surviving device -> its machine, `old_ranks` the old plan's ranks; `scalar_bytes`: each weight's state
    that is never split (a checkpoint's 0-dim tensors, `HeldState.scalar_bytes`), added whole to each rank's first
    part of it.

    A weight is cut in `finest` cells, the largest degree that splits it (old or new), each cell its share of the
    bytes; rank j of a TP-t slot needs the cells of its shard where t splits it, every cell otherwise. A part is one
    rank's need of the cells with the same old holders (`<w>[j/t cell c,.../finest]`, one part where they all lie
    together): nothing moves for it on a slot whose device j holds them.
    """
    weights = list(weights)
    degrees = sorted({*slot_degree.values(), *(r.degree for r in old_ranks)})
    finest = {w: max([t for t in degrees if w in split_at.get(t, ())] + [r.degree for r in old_ranks
                                                                        if w in r.split and w in r.weights] + [1])
              for w in weights}
    holds: dict[tuple[str, int], list[str]] = {}  # (weight, cell) -> old devices holding it, in old rank order
    for r in old_ranks:
        for w in r.weights:
            if w not in finest:
                continue
            got = cells(r.degree, r.index, finest[w]) if w in r.split else range(finest[w])
            for c in got:
                holds.setdefault((w, c), []).append(r.device)
    need_of_slot = {s: str(t) for s, t in slot_degree.items()}
    parts: dict[str, list[str]] = {w: [] for w in weights}
    need: dict[str, dict[str, tuple[str, ...]]] = {}
    nbytes, slots, machines, sources, old = {}, {}, {}, {}, {}
    for t in sorted(set(slot_degree.values())):
        ours = {s: devs for s, devs in slot_devices.items() if slot_degree[s] == t}
        need[str(t)] = {}
        for w in weights:
            f = finest[w]
            share = [state_bytes[w] // f + (1 if c < state_bytes[w] % f else 0) for c in range(f)]
            mine = []
            for j in range(t):
                first = len(mine)
                # The rank's cells with the same old holders are one part: the same sources, slots and machines.
                by_holders: dict[tuple[str, ...], list[int]] = {}
                for c in (cells(t, j, f) if w in split_at.get(t, ()) else range(f)):
                    by_holders.setdefault(tuple(holds.get((w, c), ())), []).append(c)
                for holders, cs in by_holders.items():
                    p = f"{w}[{j}/{t} cell {','.join(map(str, cs))}/{f}]"
                    mine.append(p)
                    old[p] = holders
                    sources[p] = tuple(d for d in old[p] if d in alive)
                    nbytes[p] = sum(share[c] for c in cs)
                    slots[p] = frozenset(s for s, devs in ours.items() if devs[j] in sources[p])
                    machines[p] = frozenset(alive[d] for d in sources[p])
                # State never split (a checkpoint's 0-dim tensors): whole, with the rank's first part (NOTE [bytes
                # from a checkpoint] in hetpart/replan_checkpoint.py)
                nbytes[mine[first]] += (scalar_bytes or {}).get(w, 0)
            need[str(t)][w] = tuple(mine)
            parts[w] += mine
    return Holdings({w: tuple(ps) for w, ps in parts.items()}, nbytes, slots, machines, sources, dict(alive), old,
                    need_of_slot, need)


__all__ = ["Holdings", "MixedRank", "OldRank", "as_holdings", "cells", "mixed_holdings", "state_to_move_bytes",
           "tp_holdings", "tp_part"]
