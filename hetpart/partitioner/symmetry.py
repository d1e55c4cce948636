"""Twin branches: identical parallel subgraphs whose stages can be put in order (NOTE [twin branches]).

A mixture of experts runs n identical experts side by side on the same input; every plan
that puts expert 2 ahead of expert 1 has a twin, no slower, that does the opposite. Saying
which one comes first cuts the ideals the DP of ideals.py runs over by about n! per layer,
and loses no plan's value.
"""

from __future__ import annotations

from hetpart.partitioner.costs import held_weight_bytes, node_out_tensors
from hetpart.partitioner.problem import (
    COLOCATE, FORBIDDEN_TYPES, MEM_BYTES, OUT_BYTES, PIN, TIME_NS, WEIGHTS, Problem,
)

_GROUP_MAX = 32  # nodes with the same costs and inputs tried as seeds, at most (all pairs of them are)
_WORK_PER_NODE = 50  # growths stop after mapping this many node pairs per node of the graph

# NOTE [twin branches]
# Two branches Bi, Bj (disjoint node sets, no edge between them) are twins under a bijection
# phi: Bi -> Bj when phi keeps every node's costs (time on each type, memory, output bytes, the
# sizes of its weights, each read by it alone; no pin, group or forbidden type of its own) and
# its inputs: the inputs of phi(p) are phi of p's inputs in Bi and the very same nodes outside.
# Given a plan sigma (node -> stage), sorting the two at each p, sigma'(p) = min(sigma(p),
# sigma(phi(p))) and sigma'(phi(p)) = the max, keeps every stage's multiset of nodes per
# position, hence its compute and memory; and it keeps the plan valid (min and max of
# order-keeping maps keep order) provided
#   (V) every reader outside Bj of phi(p) descends from p (so it is after max(...)).
# A value crosses boundary k when its node is at or before k and some reader after: the
# indicator [sigma(p) <= k] - AND_readers [sigma(r) <= k]. Sorting keeps the sum of the first
# terms of p and phi(p), and the second terms can only grow (for booleans, (a|b)(c|d) + abcd >=
# ac + bd, and so with any number of readers) provided
#   (B) when phi(p)'s readers outside Bj are all at or before k, so are p's outside Bi: each of
# p's is an ancestor (or the same node) of one of phi(p)'s, and p has none when phi(p) has none.
# So the sorted plan is valid and no slower, and some optimal plan has sigma(p) <= sigma(phi(p))
# everywhere: an ideal holding phi(p) holds p. Branches of one family B_0, ..., B_m (each a twin
# of B_0) whose consecutive pairs satisfy (V) and (B) are sorted together (order statistics at
# each position, by adjacent swaps, each no slower). Families with disjoint nodes sort
# independently. A twin pair inside the branches of a sorted family is sorted after it, in
# every branch at once: min and max of sorted sequences are sorted. zoo:moe: each expert, its
# slice of the gates and the gate product is a branch; the experts of a layer are one family,
# in the order their sum reads them; inside each, the gate projection before the up projection.


def _signature(problem: Problem, v: str, readers: dict[str, int]) -> tuple | None:
    """What a twin of v must match; None when v may not be in a branch."""
    g = problem.graph
    a = g.nodes[v]
    if a.get(PIN) or a.get(COLOCATE) is not None or g.in_degree(v) == 0:
        return None
    weights = a.get(WEIGHTS, ())
    if any(readers[w] > 1 for w in weights):
        return None
    return (tuple(sorted(a[TIME_NS].items())), a.get(MEM_BYTES, 0), a.get(OUT_BYTES, 0), node_out_tensors(problem, v),
            tuple(sorted(held_weight_bytes(problem, w) for w in weights)), tuple(sorted(a.get(FORBIDDEN_TYPES, ()))))


class _Twins:
    def __init__(self, problem: Problem) -> None:
        g = self.g = problem.graph
        self.rank = {v: i for i, v in enumerate(problem.node_order())}
        readers: dict[str, int] = {}
        for _, a in g.nodes(data=True):
            for w in a.get(WEIGHTS, ()):
                readers[w] = readers.get(w, 0) + 1
        self.sig = {v: _signature(problem, v, readers) for v in g.nodes}
        self._reach: dict[tuple[str, str], bool] = {}
        self.mapped = 0  # node pairs mapped by the growths so far, those that failed included

    def reaches(self, u: str, w: str) -> bool:
        """Whether w descends from u (a path u -> ... -> w, w != u)."""
        if (u, w) not in self._reach:
            limit, stack, seen, found = self.rank[w], [u], {u}, False
            while stack and not found:
                for x in self.g.successors(stack.pop()):
                    if x == w:
                        found = True
                        break
                    if x not in seen and self.rank[x] < limit:  # nodes after w in the order cannot reach it
                        seen.add(x)
                        stack.append(x)
            self._reach[(u, w)] = found
        return self._reach[(u, w)]

    def _pairs_for_inputs(self, s: str, t: str, phi: dict, inv: dict) -> dict | None:
        """New pairs that make t's inputs phi of s's, or None."""
        g = self.g
        ps, need = sorted(g.predecessors(s), key=self.rank.get), set(g.predecessors(t))
        if len(ps) != len(need):
            return None
        loose = []
        for u in ps:
            if u in inv:
                return None  # s reads a node of the other branch
            w = phi.get(u, u)
            if w in need:  # phi of a node of s's branch, or the same node outside both
                need.discard(w)
            elif u in phi:
                return None
            else:
                loose.append(u)
        found: dict[str, str] = {}
        for u in loose:
            for w in sorted(need, key=self.rank.get):
                if (w not in phi and w not in inv and w != u and self.sig[w] is not None and self.sig[w] == self.sig[u]
                        and set(g.predecessors(w)) == {phi.get(x, x) for x in g.predecessors(u)}):
                    found[u] = w
                    need.discard(w)
                    break
            else:
                return None
        return found

    def grow(self, a: str, b: str) -> dict[str, str] | None:
        """The largest twin map from the seeds a -> b that the greedy growth finds; None if it is no twin."""
        g = self.g
        phi, inv = {a: b}, {b: a}
        queue = [a]
        while queue:
            p = queue.pop(0)
            for s in sorted(g.successors(p), key=self.rank.get):
                if s in phi or s in inv or self.sig[s] is None:
                    continue
                for t in sorted(g.successors(phi[p]), key=self.rank.get):
                    if t in phi or t in inv or t == s or self.sig[t] != self.sig[s]:
                        continue
                    more = self._pairs_for_inputs(s, t, phi, inv)
                    if more is None:
                        continue
                    new = [*more.items(), (s, t)]
                    left, right = set(phi) | {u for u, _ in new}, set(inv) | {w for _, w in new}
                    if any(r in right for u, _ in new for r in g.successors(u)) or any(
                            r in left for _, w in new for r in g.successors(w)):
                        continue  # an edge between the branches
                    for u, w in new:
                        phi[u], inv[w] = w, u
                        queue.append(u)
                    break
        self.mapped += len(phi)
        return phi if self.is_twin(phi) else None

    def is_twin(self, phi: dict[str, str]) -> bool:
        """NOTE [twin branches]' definition, checked whole: costs and inputs kept, no edge between the branches."""
        g, inv = self.g, {w: u for u, w in phi.items()}
        if set(phi) & set(inv):
            return False
        for s, t in phi.items():
            if self.sig[s] is None or self.sig[s] != self.sig[t]:
                return False
            if set(g.predecessors(t)) != {phi.get(u, u) for u in g.predecessors(s)}:
                return False
            # No edge from Bj into Bi (either way round); one from Bi into Bj would be an input of
            # t that is no phi of s's inputs, which the check above rules out.
            if any(u in inv for u in g.predecessors(s)) or any(w in phi for w in g.successors(t)):
                return False
        return True

    def ordered(self, phi: dict[str, str]) -> bool:
        """Whether (V) and (B) of NOTE [twin branches] hold for phi: Bi -> Bj."""
        g, inv = self.g, {w: u for u, w in phi.items()}
        for p, q in phi.items():
            outside_p = [r for r in g.successors(p) if r not in phi]
            outside_q = [r for r in g.successors(q) if r not in inv]
            if not all(self.reaches(p, r) for r in outside_q):
                return False
            if g.nodes[p].get(OUT_BYTES, 0) > 0 and not all(
                    any(r == x or self.reaches(r, x) for x in outside_q) for r in outside_p):
                return False
        return True


def twin_order(problem: Problem) -> list[tuple[str, str]]:
    """Pairs (u, w): some optimal plan puts u in a stage no later than w's (NOTE [twin branches])."""
    tw = _Twins(problem)
    g = problem.graph
    seeds: dict[tuple, list[str]] = {}
    for v in sorted(g.nodes, key=tw.rank.get):
        if tw.sig[v] is not None:
            seeds.setdefault((tw.sig[v], frozenset(g.predecessors(v))), []).append(v)
    families = []
    for group in seeds.values():
        group = group[:_GROUP_MAX]
        for i, a in enumerate(group):
            maps: dict[frozenset, list[dict]] = {}
            for b in group[i + 1:]:
                phi = tw.grow(a, b) if tw.mapped < _WORK_PER_NODE * g.number_of_nodes() else None
                if phi is not None:
                    maps.setdefault(frozenset(phi), []).append(phi)
            families.extend(maps.items())
    families.sort(key=lambda f: (-len(f[0]), -len(f[1]), min(tw.rank[v] for v in f[0])))
    taken: set[str] = set()
    accepted: list[tuple[list[dict], set[str]]] = []  # (maps from B_0 onto the members sorted, positions used)
    pairs: list[tuple[str, str]] = []
    for dom, phis in families:
        members = [{v: v for v in dom}, *phis]  # maps from B_0 onto each member
        support = [set(m.values()) for m in members]
        disjoint = not any(support[x] & support[y] for x in range(len(members)) for y in range(x + 1, len(members)))
        if not disjoint or any(w in support[y] for x in range(len(members)) for y in range(len(members)) if x != y
                               for v in support[x] for w in g.successors(v)):
            continue
        chain = _chain(tw, members)
        if not any(s & taken for s in support):
            for x, y in chain:
                pairs.extend((members[x][v], members[y][v]) for v in sorted(dom, key=tw.rank.get))
                taken |= support[x] | support[y]
            if chain:
                sorted_members = list(dict.fromkeys(i for xy in chain for i in xy))
                accepted.append(([members[i] for i in sorted_members], set()))
            continue
        for x, y in chain:  # a twin pair inside the branches of a family sorted already
            pairs.extend(_nested(tw, accepted, {members[x][v]: members[y][v] for v in dom}))
    return pairs


def _nested(tw: _Twins, accepted: list[tuple[list[dict], set[str]]], psi: dict[str, str]) -> list[tuple[str, str]]:
    """NOTE [twin branches]: a twin pair psi inside one branch of an accepted family, sorted in
    every branch of it at once (after the family: min and max keep its order); [] if not."""
    for maps, used in accepted:
        for m in maps:
            back = {w: v for v, w in m.items()}
            if not all(v in back for v in [*psi, *psi.values()]):
                continue
            at = {back[u]: back[w] for u, w in psi.items()}  # the pair's positions in B_0
            if used & (set(at) | set(at.values())):
                return []
            images = [{mm[p]: mm[q] for p, q in at.items()} for mm in maps]
            if not all(tw.is_twin(phi) and tw.ordered(phi) for phi in images):
                return []
            used |= set(at) | set(at.values())
            return [(u, w) for phi in images for u, w in sorted(phi.items(), key=lambda uw: tw.rank[uw[0]])]
    return []


def _chain(tw: _Twins, members: list[dict]) -> list[tuple[int, int]]:
    """Consecutive pairs (x, y) of an order of the family's members, each satisfying NOTE [twin
    branches]' (V) and (B) for x before y; members by their first outside reader."""
    def first_reader(m: dict) -> int:
        inside = set(m.values())
        outs = [tw.rank[r] for v in inside for r in tw.g.successors(v) if r not in inside]
        return min(outs, default=len(tw.rank))

    order = sorted(range(len(members)), key=lambda x: (first_reader(members[x]), x))
    chain = []
    for x, y in zip(order, order[1:]):
        phi = {members[x][v]: members[y][v] for v in members[0]}
        if tw.ordered(phi):
            chain.append((x, y))
    return chain
