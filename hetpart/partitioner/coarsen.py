"""Coarsening: fewer, bigger nodes for the solvers, made of contiguous runs of one topological order.

PARTITIONING-NOTES findings 3 to 5: one CP-SAT model of a graph of thousands of
nodes stalls in presolve; coarsening is a size reducer and the op-level
refinement around the cuts (dp.py, NOTE [candidate cuts]) wins the difference back.

See NOTE [coarse nodes] for why runs of a topological order and what the coarse
problem keeps exactly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

from hetpart.partitioner.costs import has_typed_memory, held_weight_bytes, node_mem_bytes, node_out_tensors
from hetpart.partitioner.problem import (
    FORBIDDEN_TYPES, LAYER, MEM_BYTES, MEM_BYTES_OF, OUT_BYTES, OUT_TENSORS, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS,
    Problem,
)

if TYPE_CHECKING:
    from hetpart.partitioner.dp import OrderTables

# NOTE [coarse nodes]
# A coarse node is a run order[a:b] of `Problem.node_order()` between two candidate
# cuts. Runs of a topological order are convex (a path between two members stays
# between them in the order), so contracting them leaves a DAG, and every coarse plan
# is a fine plan: each node gets its run's stage. What the coarse problem keeps:
# - exactly: compute time per device type (sums), memory (mem_bytes summed, each weight
#   once per stage: a weight read by several runs keeps its name, the weights read by one
#   run only become one weight of their summed bytes and training state), the training
#   schedule (`Problem.training`), forbidden device types (union), and
#   co-location (a cut never splits a group's span, `OrderTables.cuttable`, so a group
#   lies inside one run);
# - conservatively: transfers. A run sends the sum of its members' values (bytes and tensors) read outside
#   it, as far as its last external reader: a value that stops earlier is charged on
#   more boundaries than in the fine plan. Pins: a run with a PIN_FIRST (PIN_LAST)
#   member is pinned as a whole; one with both cannot be (`pin_cuts` separates them);
# - not: the gradient sync's slices (`Problem.tp_sync`; a merged weight has no one split).
#   A coarse problem plans single pipelines only, and a pipelines plan's step is costed on
#   the problem it was asked for (tests/partitioner/test_mixed_pipelines_bound.py).
# So a coarse plan's fine cost (`evaluate` on the original problem) is at most its
# coarse cost, and the coarse solver's bound is NOT a bound of the original problem
# (the coarse plans are a subset of the fine ones, with costs rounded up): only the
# search-free bounds of bounds.py are reported for a coarsened solve.
# How runs are chosen: one per equal-work chunk of the order, cut where the fewest
# bytes cross (a module boundary, LAYER, on ties). That folds zero-cost ops into
# their neighbours and chains into one node without special cases: a chain's inner
# positions are never cheaper to cut than its ends unless the chain is heavy enough
# to be split anyway.


def cut_candidates(tab: OrderTables, count: int) -> np.ndarray:
    """About `count` cut positions of `tab.order` (sorted, with 0 and n), one per equal-work chunk.

    In each chunk the position with the fewest bytes crossing, then a LAYER boundary,
    then the earliest one; positions that split a co-location group are never chosen.
    The pin positions (after the last PIN_FIRST node, at the first PIN_LAST node) are
    always candidates, so the coarse problem keeps every pin-feasible stage count.
    """
    n = tab.n
    work = np.mean([np.diff(c).astype(np.float64) for c in tab.comp.values()], axis=0)
    prefix = np.concatenate([[0.0], np.cumsum(work)])
    valid = tab.cuttable.copy()
    valid[0] = valid[n] = False
    # Lexicographic key: bytes crossing, then not a module boundary, then position (argmin takes the first).
    key = tab.cut_bytes.astype(np.float64) * 2 + (~tab.layer_start)
    key = np.where(valid, key, np.inf)
    if prefix[-1] > 0:
        edges = np.searchsorted(prefix, prefix[-1] * np.arange(count + 1) / count)
    else:
        edges = np.linspace(0, n, count + 1).astype(np.int64)
    out = {0, n}
    for a, b in zip(edges[:-1], edges[1:]):
        lo, hi = max(int(a), 1), min(int(b) + 1, n)
        if hi > lo:
            j = lo + int(np.argmin(key[lo:hi]))
            if valid[j]:
                out.add(j)
    for j in (tab.first_end_min, tab.inner_end_max):
        if 0 < j < n and valid[j]:
            out.add(int(j))
    return np.array(sorted(out), dtype=np.int64)


def pin_cuts(problem: Problem, tab: OrderTables) -> np.ndarray:
    """Cut positions that keep nodes pinned first and nodes pinned last in different runs: between two
    pinned nodes of different kinds next in the order, the cuttable position with the fewest bytes
    crossing. With them `coarsen` gives None only where a co-location group spans both kinds."""
    pinned = [(i, a.get(PIN)) for i, a in enumerate(problem.graph.nodes[v] for v in tab.order) if a.get(PIN)]
    out = []
    for (i, kind), (j, other) in zip(pinned, pinned[1:]):
        if kind != other:
            span = np.arange(i + 1, j + 1)
            span = span[tab.cuttable[span]]
            if len(span):
                out.append(int(span[np.argmin(tab.cut_bytes[span])]))
    return np.array(out, dtype=np.int64)


@dataclass
class Coarse:
    """A coarse problem and how to read its plans back."""

    problem: Problem
    members: dict[str, list[str]]  # coarse node -> its fine nodes (a run of the order)

    def fine_stage_of(self, coarse_stage_of: dict[str, int]) -> dict[str, int]:
        return {v: s for c, s in coarse_stage_of.items() for v in self.members[c]}

    def coarse_stage_of(self, fine_stage_of: dict[str, int]) -> dict[str, int] | None:
        """The coarse plan of a fine plan that keeps every run in one stage (else None)."""
        out = {}
        for c, vs in self.members.items():
            stages = {fine_stage_of[v] for v in vs}
            if len(stages) != 1:
                return None
            out[c] = stages.pop()
        return out


def coarsen(problem: Problem, tab: OrderTables, cuts: np.ndarray) -> Coarse | None:
    """The problem with each run tab.order[cuts[i]:cuts[i+1]] as one node; NOTE [coarse nodes].

    None when a run would be pinned both first and last (cuts without `pin_cuts` among them).
    """
    g = problem.graph
    order = tab.order
    cuts = [int(c) for c in cuts]
    run_of: dict[str, int] = {}
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        for v in order[a:b]:
            run_of[v] = i
    width = len(str(len(cuts)))
    name = [f"run{i:0{width}d}" for i in range(len(cuts) - 1)]
    types = problem.device_types
    # A weight read inside one run only is held exactly when the run is: one weight per run
    # holds them all (a CP-SAT model has a literal per weight and stage).
    runs_of_weight: dict[str, set[int]] = {}
    for v in order:
        for w in g.nodes[v].get(WEIGHTS, ()):
            runs_of_weight.setdefault(w, set()).add(run_of[v])
    state = problem.training.state_bytes if problem.training is not None else {}
    weights: dict[str, int] = {}
    state_bytes: dict[str, int] = {}
    held_of: dict[str, dict[str, int]] = {}
    typed_mem = has_typed_memory(problem)
    coarse = nx.DiGraph()
    members: dict[str, list[str]] = {}
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        vs = order[a:b]
        attrs = [g.nodes[v] for v in vs]
        pins = {x.get(PIN) for x in attrs} - {None}
        if pins == {PIN_FIRST, PIN_LAST}:
            return None
        senders = [v for v in vs if any(run_of[s] != i for s in g.successors(v))]
        sends = sum(g.nodes[v].get(OUT_BYTES, 0) for v in senders)
        sends_tensors = sum(node_out_tensors(problem, v) for v in senders)
        read = sorted({w for x in attrs for w in x.get(WEIGHTS, ())})
        shared = [w for w in read if len(runs_of_weight[w]) > 1]
        private = [w for w in read if len(runs_of_weight[w]) == 1]
        for w in shared:
            weights[w] = problem.weights[w]
            if w in state:
                state_bytes[w] = state[w]
        for t in problem.held_bytes_of or {}:  # NOTE [memory per slot type] in costs.py
            held_of.setdefault(t, {}).update({w: held_weight_bytes(problem, w, t) for w in shared})
        if private:
            own = f"{name[i]}.weights"
            weights[own] = sum(problem.weights[w] for w in private)
            state_bytes[own] = sum(state.get(w, 0) for w in private)
            for t in problem.held_bytes_of or {}:
                held_of[t][own] = sum(held_weight_bytes(problem, w, t) for w in private)
            shared.append(own)
        forbidden = sorted({t for x in attrs for t in x.get(FORBIDDEN_TYPES, ())})
        coarse.add_node(
            name[i],
            **{TIME_NS: {t: sum(x[TIME_NS][t] for x in attrs) for t in types},
               MEM_BYTES: sum(x.get(MEM_BYTES, 0) for x in attrs),
               **({MEM_BYTES_OF: {t: sum(node_mem_bytes(problem, v, t) for v in vs) for t in types}}
                  if typed_mem else {}),
               OUT_BYTES: sends, OUT_TENSORS: max(1, sends_tensors), WEIGHTS: tuple(shared),
               FORBIDDEN_TYPES: tuple(forbidden),
               PIN: pins.pop() if pins else None, LAYER: attrs[0].get(LAYER)},
        )
        members[name[i]] = list(vs)
    for u, v in g.edges:
        if run_of[u] != run_of[v]:
            coarse.add_edge(name[run_of[u]], name[run_of[v]])
    training = (None if problem.training is None
                else dataclasses.replace(problem.training, state_bytes=state_bytes))
    cp = Problem(graph=coarse, weights=weights, devices=problem.devices, intra_node_links=problem.intra_node_links,
                 network=problem.network, max_stages=problem.max_stages, training=training,
                 held_bytes_of={t: held_of.get(t, {}) for t in problem.held_bytes_of or ()} or None)
    return Coarse(problem=cp, members=members)
