"""The tensor-parallel degree chosen by the solve: one problem per degree, the best plan, a bound over all.

NOTE [tensor-parallel degree choice]
`--max-tensor-parallel N` plans each degree t in 1, 2, 4, ... N as its own problem (degree 1: the
cluster's devices; t > 1: its TP groups, NOTE [tensor-parallel costs] in passes/tp_lower.py), each
solved with its own proven bound, and keeps the plan of least value. The space searched is the union
of the degrees' plans, so the least of the degrees' bounds bounds every plan of it: the plan's bound
is that least bound, its gap measured against it, and it is OPTIMAL only when its value reaches that
bound (tests/partitioner/test_tp_choice.py checks both against brute force on small problems).
Ties go to the smaller degree, so TP is chosen only where it pays in the cost model.

NOTE [mixed tensor-parallel degrees]
`choose_mixed` widens the space to plans whose degree is chosen per machine: all of a machine's
devices of one type in groups of one degree (a machine of 8 GPUs: one TP-8 slot, or two TP-4, ...,
or eight single devices), each machine its own. `mixed_problem` builds the problem over any set of
slots of the degrees' problems: each slot keeps its degree's type key, times and capacity, and each
type key its degree's memory (NOTE [memory per slot type] in costs.py), so a stage on a TP-t group
is charged the TP-t memory of its nodes in every engine a plan can come from. The search:
1. every uniform degree, as `choose_degree`;
2. the relaxation: one problem with every slot of every degree at once (overlapping groups, a
   machine of several degrees, at most one stage per physical device). Every mixed plan is one of
   its plans at the same value, so its proven bound bounds the mixed space;
3. degrees per machine the relaxation's plan uses (on a machine it uses at several, each, its
   largest stage's first; a machine it leaves unused: degree 1), at most 2 combinations, each
   solved as its own problem (from the relaxation's plan when that is one of it);
4. the best uniform degree with one device type's machines (machines of one kind alike) at the
   least other degree, for each type, then at the largest: what the relaxation's plan, found in
   the time limit on many slots, may miss; and so on from each assignment that beats the best plan
   so far (a hill climb, one device type at a time). 3 and 4 together: at most `max_assignments`
   solves.
The relaxation starts from the best uniform plan (one of its plans). The plan kept is the least of
1, 3 and 4 (ties: uniform first, then the smaller degree); its bound is the
least of the uniform degrees' bounds and the relaxation's, which bounds the union searched, and it is
OPTIMAL only when its value reaches that bound (tests/partitioner/test_tp_choice.py checks both
against brute force over every assignment of degrees to machines). A node co-located with others in
some degree (a TP region) is co-located in every mixed problem: the mixed space is that of the
union of all the degrees' co-location groups (a subset of each degree's own; every mixed problem,
the relaxation too, has the same), so the relaxation relaxes every mixed plan and the bound stays valid.
`partition` writes the plan kept, mixed or uniform (a mixed one runs with its stages' leaders in the
pipeline: NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py); `choose_tp` in hetpart/tensor_parallel.py
says what it gains over the best uniform degree. The search runs only when asked
(`--tensor-parallel-per-machine`): it costs up to 13 solves more. `--tensor-parallel MACHINE=T,...` solves one
assignment given by the user (`mixed_problem` over its slots).

NOTE [bound over a union]
A plan chosen over several problems (the degrees, the relaxation) has a bound that is the least of
theirs, not its own problem's: the plan keeps each problem's bound (`Plan.union`: its value, bound,
search-free bounds and certificate) and names the one taken (`bound_problem`; ties: the plan's own
problem). Its `bounds` and `certificate` are that problem's, so plan.json's `bounds`, `certificate`
(each with `problem`), `bound_problems` and `lower_bound_us` all state the same bound and say of
which problem; a --check-certificate verdict is the re-proof of that problem's bound, the plan's.
A mixed assignment's own bound is left out: the relaxation bounds it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

from hetpart.errors import HetpartError
from hetpart.partitioner.costs import held_weight_bytes
from hetpart.partitioner.problem import (
    COLOCATE, FORWARD_NS, MEM_BYTES, MEM_BYTES_OF, TIME_NS, Plan, Problem, SubBound,
)


@dataclass(frozen=True)
class DegreeResult:
    """One degree's solve: its plan's value and proven bound (None: no plan fits)."""

    degree: int
    value_ns: int | None
    bound_ns: int | None


@dataclass(frozen=True)
class DegreeChoice:
    """The degree kept, its plan (bound and status over every degree), and each degree's result."""

    degree: int
    plan: Plan
    results: tuple[DegreeResult, ...]


def _solved(solve: Callable[..., Plan | None], problem: Problem, **kw: Plan | None) -> Plan | None:
    try:
        return solve(problem, **kw)
    except HetpartError:  # no plan fits: nothing to keep, no bound needed
        return None


def _result(t: int, plan: Plan | None) -> DegreeResult:
    return DegreeResult(t, plan.value_ns if plan else None, plan.lower_bound_ns if plan else None)


def _sub(problem: str, plan: Plan | None) -> SubBound:
    if plan is None:
        return SubBound(problem, None, None)
    return SubBound(problem, plan.value_ns, plan.lower_bound_ns, plan.bounds, plan.certificate)


def least_bound(best: Plan, union: Sequence[SubBound], own: str | None) -> Plan:
    """NOTE [bound over a union]: `best` (a plan of the problem named `own`; None: of none of `union`) with the least
    bound of `union`, that problem's bounds and certificate, and its status against that bound."""
    have = [s for s in union if s.bound_ns is not None]
    bound = min(s.bound_ns for s in have)
    taken = min(have, key=lambda s: (s.bound_ns, s.problem != own))
    status = best.solver_status if own is not None and bound >= best.lower_bound_ns else (
        "OPTIMAL" if best.value_ns <= bound else "FEASIBLE")
    return dataclasses.replace(best, lower_bound_ns=bound, solver_status=status, bounds=taken.bounds,
                               certificate=taken.certificate, union=tuple(union), bound_problem=taken.problem)


def choose_degree(problems: Mapping[int, Problem], solve: Callable[[Problem], Plan | None]) -> DegreeChoice:
    """NOTE [tensor-parallel degree choice]: `solve` each degree's problem; the least plan, with the least bound."""
    plans: dict[int, Plan] = {}
    results = []
    for t in sorted(problems):
        plan = _solved(solve, problems[t])  # None: nothing of this degree fits (memory, a node too large)
        if plan is not None:
            plans[t] = plan
        results.append(_result(t, plan))
    if not plans:
        raise HetpartError(f"no tensor-parallel degree of {', '.join(map(str, sorted(problems)))} has a plan that "
                           "fits this cluster's memory")
    degree = min(plans, key=lambda t: (plans[t].value_ns, t))
    # A degree without a plan has none that fits: it adds nothing to the space, and so no bound to the least.
    union = [_sub(f"TP {t}", plans.get(t)) for t in sorted(problems)]
    return DegreeChoice(degree, least_bound(plans[degree], union, f"TP {degree}"), tuple(results))


@dataclass(frozen=True)
class TPSlot:
    """A slot of one degree's problem (NOTE [mixed tensor-parallel degrees]): its name there, its devices."""

    name: str
    devices: tuple[str, ...]
    machine: str
    device_type: str  # the devices' type (not the problem's type key)
    degree: int

    @property
    def place(self) -> str:
        """What one degree is chosen for: a machine's devices of one type."""
        return f"{self.machine}:{self.device_type}"


def mixed_problem(problems: Mapping[int, Problem], slots: Sequence[TPSlot]) -> Problem:
    """One problem over `slots`, each costed as in its degree's problem, memory per slot type exact
    (NOTE [mixed tensor-parallel degrees], NOTE [memory per slot type] in costs.py)."""
    used = sorted({s.degree for s in slots})
    first = problems[used[0]]
    devices = [problems[s.degree].device(s.name) for s in slots]
    degree_of_key = {d.type: s.degree for s, d in zip(slots, devices)}
    graphs = {t: problems[t].graph for t in used}
    g = first.graph.copy()
    for v, a in g.nodes(data=True):
        of = {k: graphs[t].nodes[v] for k, t in degree_of_key.items()}
        a[TIME_NS] = {k: x[TIME_NS][k] for k, x in of.items()}
        if FORWARD_NS in a:
            a[FORWARD_NS] = {k: x.get(FORWARD_NS, {}).get(k, 0) for k, x in of.items()}
        mem = {k: x.get(MEM_BYTES, 0) for k, x in of.items()}
        a[MEM_BYTES] = min(mem.values())  # type-free: the least, so type-free bounds relax it
        a.pop(MEM_BYTES_OF, None)
        if len(set(mem.values())) > 1:
            a[MEM_BYTES_OF] = mem
        a.pop(COLOCATE, None)
    # Co-location: the union of every degree's groups, used here or not (so the relaxation relaxes every mixed plan).
    uf = nx.utils.UnionFind()
    for t in sorted(problems):
        by_group: dict[str, list[str]] = {}
        for v, c in problems[t].graph.nodes(data=COLOCATE):
            if c is not None:
                by_group.setdefault(c, []).append(v)
        for members in by_group.values():
            uf.union(*members)
    for i, members in enumerate(sorted(sorted(m) for m in uf.to_sets() if len(m) > 1)):
        for v in members:
            g.nodes[v][COLOCATE] = f"colocate-{i}"
    # Weights and training state: type-free the least over the degrees; each type key its own where it differs.
    weights = {w: min(problems[t].weights[w] for t in used) for w in first.weights}
    training = first.training
    if training is not None:
        training = dataclasses.replace(training, state_bytes={
            w: min(problems[t].training.state_bytes.get(w, 0) for t in used) for w in training.state_bytes})
    free = Problem(graph=g, weights=weights, devices=devices, intra_node_links=first.intra_node_links,
                   network=first.network, training=training)
    held_of = {}
    for k, t in degree_of_key.items():
        differ = {w: h for w in weights if (h := held_weight_bytes(problems[t], w)) != held_weight_bytes(free, w)}
        if differ:
            held_of[k] = differ
    physical = len({d for s in slots for d in s.devices})
    limits = [physical] + [problems[t].max_stages for t in used if problems[t].max_stages]
    return dataclasses.replace(free, max_stages=min(limits), held_bytes_of=held_of or None)


RELAXATION = "mixed relaxation"  # NOTE [mixed tensor-parallel degrees] step 2, as `Plan.union` names it


@dataclass(frozen=True)
class MixedChoice:
    """NOTE [mixed tensor-parallel degrees]: the plan kept, each place's degree, and what was solved."""

    plan: Plan  # with the bound over the whole space searched
    problem: Problem  # the plan's problem
    degree_of_place: dict[str, int]  # TPSlot.place -> degree (a uniform plan: every place that degree)
    uniform: DegreeChoice | None  # the best uniform degree, its bound the least of theirs (None: none fits)
    relaxed: DegreeResult  # degree 0: the relaxation's plan value and bound
    mixed: tuple[DegreeResult, ...]  # degree 0: the plans of the relaxation's degrees per machine, as solved
    tried: tuple[dict[str, int], ...] = ()  # those degrees per place, in the order of `mixed`

    @property
    def is_mixed(self) -> bool:
        return len(set(self.degree_of_place.values())) > 1


def _assignments(relaxed: Plan, slot: Mapping[str, TPSlot], places: list[str], unused: int,
                 most: int) -> list[dict[str, int]]:
    """NOTE [mixed tensor-parallel degrees] step 3: per place, a degree the relaxation's plan uses there (its
    largest stage's first; a place it leaves unused: `unused`), at most `most` combinations, likeliest first."""
    size: dict[str, dict[int, int]] = {}  # place -> degree -> its largest stage's compute there
    for s in relaxed.stages:
        sl = slot[s.device]
        size.setdefault(sl.place, {})[sl.degree] = max(size.get(sl.place, {}).get(sl.degree, -1), s.compute_ns)
    options = [sorted(size[p], key=lambda t: (-size[p][t], t)) if p in size else [unused] for p in places]
    combos = sorted(itertools.product(*[range(len(o)) for o in options]), key=lambda c: (sum(c), c))[:most]
    return [{p: options[i][c[i]] for i, p in enumerate(places)} for c in combos]


def _neighbours(degree_of: dict[str, int], available: dict[str, set[int]]) -> list[dict[str, int]]:
    """`degree_of` with one device type's places (machines of one kind alike) at the least, then the largest other
    degree they have: every type at its least before any at its largest (NOTE [mixed tensor-parallel degrees])."""
    out = []
    for pick in (0, -1):
        for ty in sorted({p.split(":", 1)[1] for p in degree_of}):
            places = [p for p in degree_of if p.split(":", 1)[1] == ty]
            common = sorted(set.intersection(*(available[p] for p in places)) - {degree_of[p] for p in places})
            if common and (pick == 0 or len(common) > 1):
                out.append({p: common[pick] if p in places else d for p, d in degree_of.items()})
    return out


def choose_mixed(problems: Mapping[int, Problem], slots_of: Mapping[int, Sequence[TPSlot]],
                 solve: Callable[..., Plan | None], max_assignments: int = 12) -> MixedChoice:
    """NOTE [mixed tensor-parallel degrees]: `solve(problem)` per uniform degree and for the relaxation, then
    `solve(problem, hint=plan)` for the relaxation's degrees per machine (hint None unless its plan fits)."""
    slot = {s.name: s for t in sorted(slots_of) for s in slots_of[t]}
    places = sorted({s.place for s in slot.values()})
    found: list[tuple[tuple, Plan, Problem, dict[str, int]]] = []  # (tie key, plan, problem, degree per place)
    try:
        uniform = choose_degree(problems, solve)  # 1.: its plan's bound is the least of the degrees'
    except HetpartError:  # no uniform degree fits
        uniform = None
    if uniform is not None:
        t = uniform.degree
        found.append(((0, t), uniform.plan, problems[t], {s.place: t for s in slots_of[t]}))
    relaxed_problem = mixed_problem(problems, list(slot.values()))
    relaxed = _solved(solve, relaxed_problem, hint=uniform.plan if uniform is not None else None)
    mixed: list[DegreeResult] = []
    tried: list[dict[str, int]] = []
    start = {p: found[0][3].get(p, min(problems)) for p in places} if uniform is not None else None
    available = {p: {s.degree for s in slot.values() if s.place == p} for p in places}
    queue = [] if relaxed is None else _assignments(relaxed, slot, places, min(problems), 2) + (
        _neighbours(start, available) if start is not None else [])
    best_ns = uniform.plan.value_ns if uniform is not None else None
    # The relaxation's plan is a hint for an assignment that has all its slots, unless it uses a device twice.
    relaxed_devices = [d for s in relaxed.stages for d in slot[s.device].devices] if relaxed is not None else []
    relaxed_distinct = len(set(relaxed_devices)) == len(relaxed_devices)
    while queue and len(tried) < max_assignments:  # steps 3 and 4, then 4 again from each better plan
        degree_of = queue.pop(0)
        if degree_of in tried or degree_of == start:
            continue
        tried.append(degree_of)
        chosen = [s for s in slot.values() if degree_of[s.place] == s.degree]
        problem = mixed_problem(problems, chosen)
        names = {s.name for s in chosen}
        fits = relaxed_distinct and all(s.device in names for s in relaxed.stages)
        plan = _solved(solve, problem, hint=relaxed if fits else None)
        mixed.append(_result(0, plan))
        if plan is not None:
            found.append(((1, len(mixed)), plan, problem, degree_of))
            if best_ns is None or plan.value_ns < best_ns:
                best_ns = plan.value_ns
                queue += _neighbours(degree_of, available)  # after the round in hand
    if not found:
        raise HetpartError(f"no tensor-parallel degree of {', '.join(map(str, sorted(problems)))}, uniform or "
                           "mixed per machine, has a plan that fits this cluster's memory")
    key, best, problem, degree_of = min(found, key=lambda f: (f[1].value_ns, f[0]))
    union = [*(uniform.plan.union if uniform is not None else ()), _sub(RELAXATION, relaxed)]
    plan = least_bound(best, union, f"TP {key[1]}" if key[0] == 0 else None)
    return MixedChoice(plan, problem, degree_of, uniform, _result(0, relaxed), tuple(mixed), tuple(tried))


__all__ = ["DegreeChoice", "DegreeResult", "MixedChoice", "RELAXATION", "TPSlot", "choose_degree", "choose_mixed",
           "least_bound", "mixed_problem"]
