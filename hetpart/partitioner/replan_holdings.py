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
A part no surviving device holds is read from the checkpoint whatever the plan. `as_holdings` builds the
one-device form from the plain holders (weight -> old devices) every engine took before: one part per
weight, the problem's own devices the only ones alive (a sub-problem's too, as before). The bytes the
runtime then reads are NOTE [checkpoint slices]'s: a new TP rank reads exactly its shard's slices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetpart.partitioner.costs import held_weight_bytes
from hetpart.partitioner.problem import Problem


def state_to_move_bytes(problem: Problem, weight: str) -> int:
    """Bytes that move with a weight: its value and, in training, its optimizer state (its gradient is
    recomputed): `held_weight_bytes` less the gradient, which is the weight's own size."""
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

    def total_bytes(self) -> int:
        return sum(self.nbytes[p] for ps in self.parts.values() for p in ps)


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


__all__ = ["Holdings", "OldRank", "as_holdings", "state_to_move_bytes", "tp_holdings", "tp_part"]
