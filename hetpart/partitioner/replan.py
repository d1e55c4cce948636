"""Re-planning for a changed device set: as fast as the best plan (within a slack), moving the fewest bytes.

NOTE [lexicographic re-plan]
When devices are lost or added (spot capacity), the old ranks hold the weights and optimizer state
(the run's checkpoint holds all of them). A new plan is chosen in three steps:
1. the best plan of the new device set: the from-scratch plan `solve` gives, bottleneck B
   (its own bound and gap say how far from optimal it is);
2. among plans with bottleneck <= floor(B * (1 + slack)), the fewest bytes moved between machines;
3. among those, the fewest bytes moved within machines.
Steps 2 and 3 are two solves of the CP-SAT model of cpsat.py (`_build`, without the rule that uses
interchangeable devices in list order, since here which of them runs a stage matters), the
bottleneck capped, the plan of step 1 as its hint, with two more sets of literals per weight w
held by stage k (`holds[w][k]`):
    inter[w,k] >= holds[w][k] - [k's machine has a surviving holder of w]
    intra[w,k] >= holds[w][k] + [k's machine has one] - 1 - [k's device is one]
Step 2 minimises sum bytes(w) * inter, step 3 fixes it and minimises sum bytes(w) * intra.
What moves (`moves`, recomputed from the plan, never from solver values): for each stage and each
weight it holds, nothing if its device held it; else from a holder on its machine (within); else from
a holder on another machine (between); else (every holder lost) from the checkpoint, read over the
network (between machines too, and the same bytes whichever plan is chosen). The bytes of a weight
are its value plus its optimizer state (`state_to_move_bytes`: as the plan costs it, or as a run's checkpoint
holds it, NOTE [bytes from a checkpoint] in hetpart/replan_checkpoint.py): the gradient is recomputed. Each
link's predicted time is costs.transfer_ns of its bytes (one transfer per link); links run in
parallel, so the whole move takes the slowest link's time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ortools.sat.python import cp_model

from hetpart.errors import HetpartError
from hetpart.partitioner.costs import machine_link, transfer_ns
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.problem import WEIGHTS, Plan, Problem, stage_weights
from hetpart.partitioner.replan_holdings import Holdings, as_holdings, state_to_move_bytes  # noqa: F401 (re-exported)

Holders = Mapping[str, tuple[str, ...]] | Holdings  # weight -> old devices, or NOTE [re-plan by shard]'s parts

CHECKPOINT = "checkpoint"  # the source of a weight whose every holder is gone


def lost_state_bytes(problem: Problem, holders: Holders) -> int:
    """The lower limit of any plan's bytes moved: the state of every part no surviving device holds, which
    some stage must read from the checkpoint (counted once, where `moves` counts each stage that reads it)."""
    return as_holdings(problem, holders).lost_bytes(problem.weights, [d.name for d in problem.devices])


@dataclass(frozen=True)
class Move:
    weight: str
    nbytes: int
    source: str  # a surviving device that held it, or CHECKPOINT
    target: str  # the new plan's device


@dataclass(frozen=True)
class Moves:
    """What a plan moves from where the old ranks (or the checkpoint) hold it (NOTE [lexicographic re-plan])."""

    moves: list[Move]
    between_bytes: int  # between machines, from surviving holders
    within_bytes: int  # inside a machine, between devices
    checkpoint_bytes: int  # read from the checkpoint (every holder lost)
    link_bytes: dict[str, int]  # "a -> b" (machines, or "checkpoint -> b") -> bytes
    link_time_ns: dict[str, int]  # costs.transfer_ns of each link's bytes

    @property
    def time_ns(self) -> int:
        """The move's predicted time: links in parallel, so the slowest link's."""
        return max(self.link_time_ns.values(), default=0)

    def to_json(self) -> dict:
        return {"between_machines_bytes": self.between_bytes, "within_machines_bytes": self.within_bytes,
                "from_checkpoint_bytes": self.checkpoint_bytes,
                "links": [{"link": k, "bytes": self.link_bytes[k], "time_us": round(self.link_time_ns[k] / 1000, 3)}
                          for k in sorted(self.link_bytes)],
                "predicted_time_us": round(self.time_ns / 1000, 3)}


def moves(problem: Problem, stage_of: Mapping[str, int], device_of_stage: list[str], holders: Holders) -> Moves:
    """The bytes a plan moves, by NOTE [lexicographic re-plan]; `holders`: weight -> old devices holding a copy
    (devices not in `problem` are lost), or the parts of NOTE [re-plan by shard]."""
    return stage_moves(problem, stage_weights(problem, stage_of), device_of_stage, holders)


def stage_moves(problem: Problem, held: Mapping[int, set[str]], device_of_stage: list[str], holders: Holders) -> Moves:
    """`moves` of stages given by the weights each holds (`held`: stage -> weights), on `device_of_stage`: one
    pipeline's, or several pipelines' stages in a row (NOTE [re-plan pipelines] in replan_pipelines.py)."""
    h = as_holdings(problem, holders)
    machine = {d.name: d.node for d in problem.devices}
    out, between, within, ckpt = [], 0, 0, 0
    link_bytes: dict[str, int] = {}
    links = {}
    for k, weights in sorted(held.items()):
        target = device_of_stage[k]
        for w in sorted(weights):
            for part in h.needed(w, target):
                if target in h.slots[part]:
                    continue
                nbytes = h.nbytes[part]
                local = [d for d in h.sources[part] if h.machine[d] == machine[target]]
                source = (local or list(h.sources[part]) or [CHECKPOINT])[0]
                if local:
                    within += nbytes
                elif h.sources[part]:
                    between += nbytes
                else:
                    ckpt += nbytes
                src_machine = h.machine.get(source, CHECKPOINT)
                key = f"{src_machine} -> {machine[target]}"
                link_bytes[key] = link_bytes.get(key, 0) + nbytes
                links[key] = problem.network if source == CHECKPOINT else machine_link(problem, src_machine,
                                                                                        machine[target])
                out.append(Move(part, nbytes, source, target))
    return Moves(out, between, within, ckpt, link_bytes, {k: transfer_ns(links[k], b) for k, b in link_bytes.items()})


@dataclass
class Replan:
    """The chosen plan, the from-scratch plan, and what each moves."""

    plan: Plan
    scratch: Plan
    moves: Moves
    scratch_moves: Moves
    slack: float
    limit_ns: int  # the bottleneck the chosen plan may reach: floor(B * (1 + slack))
    status: list[str] = field(default_factory=list)  # CP-SAT's status of steps 2 and 3
    seconds: float = 0.0

    def to_json(self) -> dict:
        """plan.json's `replan` record."""
        us = lambda ns: round(ns / 1000, 3)  # noqa: E731
        return {"slack": self.slack, "bottleneck_limit_us": us(self.limit_ns),
                "chosen": {"bottleneck_us": us(self.plan.bottleneck_ns), "devices": self.plan.device_of_stage,
                           **self.moves.to_json()},
                "from_scratch": {"bottleneck_us": us(self.scratch.bottleneck_ns),
                                 "devices": self.scratch.device_of_stage, "gap": round(self.scratch.gap, 6),
                                 **self.scratch_moves.to_json()},
                "solver_status": self.status, "replan_s": round(self.seconds, 3)}


def _solve(model: cp_model.CpModel, time_limit_s: float, seed: int) -> tuple[cp_model.CpSolver, int]:
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit_s)
    solver.parameters.random_seed = seed
    solver.parameters.num_workers = 1
    solver.parameters.cp_model_probing_level = 0
    return solver, solver.solve(model)


# NOTE [large re-plan]: past `RELABEL_ABOVE` nodes (a Llama's thousands of ops over dozens of devices) the
# CP-SAT model of steps 2 and 3 finds nothing in seconds (measured: UNKNOWN at 1 s a step on zoo:llama-7b,
# hetero-64), so the re-plan keeps the from-scratch plan's cuts and device types and only relabels it:
# machines of one kind (the same intra-machine link and the same devices: types and capacities) swap
# whole, and inside a machine devices of one type and capacity swap. Each stage keeps its compute, memory
# and links, so every cost is the from-scratch plan's exactly. Among these relabelings: the one with the
# fewest bytes between machines, then within (every permutation of a kind's machines up to
# `PERMUTE_MACHINES`, else machines matched by their bytes between only; devices matched per machine by
# networkx's max_weight_matching, exact on integer bytes). Status "RELABELED": the cuts are not re-chosen.
# Given the old plan's devices (`old_devices`), a second candidate keeps their order (the devices still
# alive, every one a stage) and chooses the cuts for the bytes: a DP over about `KEPT_ORDER_CUTS`
# candidate cut positions (coarsen.py's, plus the from-scratch plan's) whose stages each stay within the
# bottleneck cap (dp.py's tables and costs.py's formulas) and whose bytes between machines (then within,
# as a fraction below one byte: ties only) are the fewest; a weight two nodes of a stage read counts
# twice there (an over-count), and the plan it gives is re-costed and its moves recounted exactly.
# A third candidate, NOTE [re-plan DP] (replan_dp.py): the old order with devices skipped and free ones
# inserted, cuts at more positions, refined op by op, for the fewest bytes (status "BYTES_DP"). Its
# family holds the kept order's plans (its cut positions aside), so the kept order runs only when the
# DP finds no plan. The best candidate by (bytes between, within) is kept: status "KEPT_ORDER" or
# "BYTES_DP" when it is one of those.
RELABEL_ABOVE = 400
PERMUTE_MACHINES = 6
KEPT_ORDER_CUTS = 256
LARGE_STATUSES = ("RELABELED", "BYTES_DP", "KEPT_ORDER")  # NOTE [large re-plan]'s candidates: no CP-SAT runs


def lexicographic_plan(problem: Problem, scratch: Plan, holders: Holders, *,
                       slack: float = 0.02, time_limit_s: float = 30.0, seed: int = 0,
                       old_devices: list[str] | None = None, deadline=None) -> Replan:
    """NOTE [lexicographic re-plan]: within `slack` of `scratch` (the from-scratch plan), the fewest bytes moved
    between machines, then within them. Falls back to `scratch` where CP-SAT finds nothing better in time;
    a large problem is relabeled only (NOTE [large re-plan]). CP-SAT's steps take `time_limit_s`, or what is
    left of `deadline` (NOTE [re-plan deadline] in replan_deadline.py)."""
    from hetpart.partitioner.replan_deadline import Deadline

    if not 0 <= slack < 1:
        raise HetpartError(f"--slack must be a fraction in [0, 1), e.g. 0.02 for 2% (got {slack})")
    start = time.perf_counter()
    holders = as_holdings(problem, holders)  # NOTE [re-plan by shard]: built once for every engine
    limit = math.floor(scratch.bottleneck_ns * (1 + slack))
    if problem.graph.number_of_nodes() > RELABEL_ABOVE:
        relabeled, dp_status, kept_status = LARGE_STATUSES
        best, status = (scratch.stage_of, relabel(problem, scratch, holders)), [relabeled]
        bytes_dp = _bytes_first(problem, scratch, holders, old_devices, limit) if old_devices else None
        if bytes_dp is not None and _moved(problem, bytes_dp, holders) < _moved(problem, best, holders):
            best, status = bytes_dp, [dp_status]
        kept = _kept_order(problem, scratch, holders, old_devices, limit) if old_devices and bytes_dp is None else None
        if kept is not None and _moved(problem, kept, holders) < _moved(problem, best, holders):
            best, status = kept, [kept_status]
    else:
        best, status = _solve_lexicographic(problem, scratch, holders, limit, deadline or Deadline(time_limit_s),
                                            seed)
    fallback = (scratch.stage_of, scratch.device_of_stage)
    if _moved(problem, fallback, holders) < _moved(problem, best, holders):  # a step stopped early (time, invalid)
        best, status = fallback, status + ["KEPT_SCRATCH"]
    plan = chosen_plan(problem, scratch, *best)
    if plan.bottleneck_ns > limit:  # cannot happen: the model caps it, a relabeling keeps every cost
        raise RuntimeError(f"hetpart bug: re-plan bottleneck {plan.bottleneck_ns} ns above the limit {limit} ns")
    return Replan(plan, scratch, moves(problem, plan.stage_of, plan.device_of_stage, holders),
                  moves(problem, scratch.stage_of, scratch.device_of_stage, holders), slack, limit, status,
                  time.perf_counter() - start)


def _moved(problem: Problem, plan: tuple[dict[str, int], list[str]],
           holders: Holders) -> tuple[int, int]:
    """A candidate's (bytes between machines, bytes within): the order of NOTE [lexicographic re-plan]."""
    mv = moves(problem, *plan, holders)
    return mv.between_bytes, mv.within_bytes


def relabel(problem: Problem, scratch: Plan, holders: Holders) -> list[str]:
    """NOTE [large re-plan]: the from-scratch plan's stages on other devices of the same kind, the fewest bytes
    moved between machines, then within; each stage's new device."""
    return relabel_stages(problem, stage_weights(problem, scratch.stage_of), scratch.device_of_stage, holders)


def relabel_stages(problem: Problem, held: Mapping[int, set[str]], device_of_stage: list[str],
                   holders: Holders) -> list[str]:
    """`relabel` of stages given by the weights each holds (`held`) on `device_of_stage`: one pipeline's, or
    several pipelines' in a row (NOTE [re-plan pipelines] in replan_pipelines.py); each stage's new device."""
    import itertools

    import networkx as nx

    dev = {d.name: d for d in problem.devices}
    h = as_holdings(problem, holders)
    on: dict[str, list[int]] = {}
    for k, d in enumerate(device_of_stage):
        on.setdefault(dev[d].node, []).append(k)
    members: dict[str, list[str]] = {}
    for d in problem.devices:
        members.setdefault(d.node, []).append(d.name)

    def kind(mc: str) -> tuple:
        return (problem.intra_node_links.get(mc), sorted((dev[d].type, dev[d].capacity_bytes) for d in members[mc]))

    def place(plan_mc: str, real_mc: str) -> tuple[int, int, dict[int, str]]:
        """Bytes between and within machines, and each stage's device, with plan_mc's stages on real_mc."""
        there = {p for p, machines in h.machines.items() if real_mc in machines}
        between = sum(h.nbytes[p] for k in on.get(plan_mc, []) for w in held.get(k, ())
                      for p in h.needed(w, device_of_stage[k]) if p not in there and h.sources[p])
        within, where = 0, {}
        groups: dict[tuple, list[int]] = {}
        for k in on.get(plan_mc, []):
            d = dev[device_of_stage[k]]
            groups.setdefault((d.type, d.capacity_bytes), []).append(k)
        for key, stages in groups.items():
            devices = [d for d in members[real_mc] if (dev[d].type, dev[d].capacity_bytes) == key]
            cost = {(k, d): sum(h.nbytes[p] for w in held.get(k, ()) for p in h.needed(w, d)
                                if p in there and d not in h.slots[p])
                    for k in stages for d in devices}
            top = max(cost.values(), default=0) + 1
            g = nx.Graph()
            g.add_weighted_edges_from((("s", k), ("d", d), top - c) for (k, d), c in cost.items())
            for a, b in nx.max_weight_matching(g, maxcardinality=True):
                k, d = (a[1], b[1]) if a[0] == "s" else (b[1], a[1])
                where[k] = d
                within += cost[(k, d)]
        return between, within, where

    kinds: dict[tuple, list[str]] = {}
    for mc in members:
        kinds.setdefault(repr(kind(mc)), []).append(mc)
    devices = list(device_of_stage)
    for machines in kinds.values():
        used = [mc for mc in machines if mc in on]
        if not used:
            continue
        table = {(a, b): place(a, b) for a in used for b in machines}
        if len(machines) <= PERMUTE_MACHINES:
            options = itertools.permutations(machines, len(used))
        else:  # machines matched by their bytes between only (NOTE [large re-plan])
            g = nx.Graph()
            top = max(v[0] for v in table.values()) + 1
            g.add_weighted_edges_from((("p", a), ("r", b), top - table[(a, b)][0]) for a in used for b in machines)
            mate = {}
            for x, y in nx.max_weight_matching(g, maxcardinality=True):
                p, r = (x[1], y[1]) if x[0] == "p" else (y[1], x[1])
                mate[p] = r
            options = [tuple(mate[a] for a in used)]
        best = min(options, key=lambda targets: (sum(table[(a, b)][0] for a, b in zip(used, targets)),
                                                 sum(table[(a, b)][1] for a, b in zip(used, targets))))
        for a, b in zip(used, best):
            for k, d in table[(a, b)][2].items():
                devices[k] = d
    return devices


def _kept_order(problem: Problem, scratch: Plan, holders: Holders, old_devices: list[str],
                limit: int) -> tuple[dict[str, int], list[str]] | None:
    """NOTE [large re-plan]'s second candidate: the old devices still alive in their order, cuts for the bytes."""
    import numpy as np

    from hetpart.partitioner.coarsen import cut_candidates
    from hetpart.partitioner.costs import segment_time_table_ns, slot_capacity_bytes, stash_microbatches
    from hetpart.partitioner.dp import order_tables, valid_cuts

    dev = {d.name: d for d in problem.devices}
    devices = [d for d in old_devices if d in dev]
    if not devices:
        return None
    tab = order_tables(problem)
    n, S = tab.n, len(devices)
    at = {v: i for i, v in enumerate(tab.order)}
    own = {at[v] for v, k in scratch.stage_of.items() if at[v] > 0 and scratch.stage_of[tab.order[at[v] - 1]] != k}
    valid = valid_cuts(tab)
    P = np.array(sorted({0, n} | {int(c) for c in cut_candidates(tab, KEPT_ORDER_CUTS) if valid[c]}
                        | {c for c in own if valid[c]}), dtype=np.int64)
    h = as_holdings(problem, holders)
    total_within = h.total_bytes() + 1
    G = np.where(P == 0, 0.0, np.inf)
    backs = []
    for k, d in enumerate(devices):
        # Bytes each node's weights move to d: between machines, plus within as a fraction (NOTE [large re-plan]).
        cost = np.zeros(n + 1)
        for i, v in enumerate(tab.order):
            c = 0.0
            for p in (p for w in problem.graph.nodes[v].get(WEIGHTS, ()) for p in h.needed(w, d)):
                if not h.sources[p] or d in h.slots[p]:
                    continue
                c += h.nbytes[p] / total_within if dev[d].node in h.machines[p] else h.nbytes[p]
            cost[i + 1] = c
        prefix = np.cumsum(cost)
        slot = problem.slot(d)
        tin = _transfer(problem, devices[k - 1], d, tab, P) if k > 0 else np.zeros(len(P), np.int64)
        tout = _transfer(problem, d, devices[k + 1], tab, P) if k < S - 1 else np.zeros(len(P), np.int64)
        time_ns = segment_time_table_ns((tab.comp[slot.type][P], tab.comp[slot.type][P]), tin, tout)
        mem = tab.seg_mem(P, P, stash_microbatches(problem, k, S))
        ok = tab.allowed(slot.type, P, P) & (mem <= slot_capacity_bytes(problem, slot)) & (time_ns <= limit)
        ok &= np.isfinite(G)[:, None]
        if k == S - 1:
            ok &= (P <= tab.final_start_max)[:, None] & (P == n)[None, :]
        val = np.where(ok, G[:, None] + (prefix[P][None, :] - prefix[P][:, None]), np.inf)
        arg = np.argmin(val, axis=0)
        G = val[arg, np.arange(len(P))]
        backs.append(arg)
    end = int(np.searchsorted(P, n))
    if not np.isfinite(G[end]):
        return None
    cuts, j = [n], end
    for k in range(S - 1, -1, -1):
        j = int(backs[k][j])
        cuts.append(int(P[j]))
    cuts = cuts[::-1]
    stage_of = {v: k for k in range(S) for v in tab.order[cuts[k]:cuts[k + 1]]}
    plan = chosen_plan(problem, scratch, stage_of, devices)
    return (stage_of, devices) if plan.bottleneck_ns <= limit else None


def _bytes_first(problem: Problem, scratch: Plan, holders: Holders, old_devices: list[str],
                 limit: int) -> tuple[dict[str, int], list[str]] | None:
    """NOTE [large re-plan]'s third candidate: NOTE [re-plan DP] (replan_dp.py), re-costed and checked here."""
    from hetpart.partitioner.dp import order_tables
    from hetpart.partitioner.replan_dp import bytes_first_plan
    from hetpart.partitioner.verify import plan_violations

    tab = order_tables(problem)
    at = {v: i for i, v in enumerate(tab.order)}
    own = [at[v] for v, k in scratch.stage_of.items() if at[v] > 0 and scratch.stage_of[tab.order[at[v] - 1]] != k]
    got = bytes_first_plan(problem, tab, as_holdings(problem, holders), old_devices, limit, own)
    if got is None:
        return None
    stage_of = {v: k for k in range(len(got.devices)) for v in tab.order[got.cuts[k]:got.cuts[k + 1]]}
    plan = chosen_plan(problem, scratch, stage_of, got.devices)
    return (stage_of, got.devices) if plan.bottleneck_ns <= limit and not plan_violations(problem, plan) else None


def _transfer(problem: Problem, a: str, b: str, tab, P) -> object:
    """costs.transfer_ns over the link between devices `a` and `b`, of the bytes and tensors over cuts `P` of `tab`."""
    from hetpart.partitioner.costs import link_between

    return transfer_ns(link_between(problem, a, b), tab.cut_bytes[P], tab.cut_tensors[P])


def _solve_lexicographic(problem: Problem, scratch: Plan, holders: Holders, limit: int,
                         deadline, seed: int) -> tuple[tuple[dict[str, int], list[str]], list[str]]:
    """Steps 2 and 3 of NOTE [lexicographic re-plan]: ((stage_of, devices), CP-SAT's status of each)."""
    from hetpart.partitioner.cpsat import _add_hint, _build

    mdl = _build(problem, "throughput", break_symmetry=False)
    m = mdl.model
    # The plan is at most `slack` slower than the from-scratch plan.
    m.add(mdl.bottleneck <= limit)
    h = as_holdings(problem, holders)
    between, within = [], []
    # The slots by the parts they need: one class, or one per degree of mixed degrees (NOTE [re-plan by shard]).
    needs: dict[str | None, list[str]] = {}
    for d in problem.devices:
        needs.setdefault(h.need_of_slot[d.name] if h.need is not None else None, []).append(d.name)
    for w, holds in sorted(mdl.holds.items()):
        for key, members in sorted(needs.items(), key=lambda kv: str(kv[0])):
            for p in h.needed(w, members[0]):  # one part per weight, or per TP rank and cell
                if not h.sources[p]:
                    continue  # read from the checkpoint whatever the plan: a constant
                for k in range(mdl.num_stages):
                    # Stage k runs on a slot that needs p (always, with one class: a stage holding w needs it).
                    on_class = 1 if len(needs) == 1 else sum(mdl.a[k][d] for d in members)
                    # ... on a slot that held p (of this problem: a pipeline's sub-problem has only its own slots)
                    on_holder = sum(mdl.a[k][d] for d in sorted(h.slots[p]) if d in mdl.a[k])
                    # ... on a machine where a surviving device holds it
                    on_machine = sum(mdl.on_machine[k][mc] for mc in sorted(h.machines[p]) if mc in mdl.on_machine[k])
                    inter, intra = m.new_bool_var(f"between[{p},{k}]"), m.new_bool_var(f"within[{p},{k}]")
                    # Stage k holds w on a slot needing p, on a machine where no surviving device held p: p moves
                    # between machines.
                    m.add(inter >= holds[k] + on_class - 1 - on_machine)
                    # Stage k holds it on a machine where one did, but not on such a slot: p moves inside it.
                    m.add(intra >= holds[k] + on_class + on_machine - 2 - on_holder)
                    between.append(h.nbytes[p] * inter)
                    within.append(h.nbytes[p] * intra)
    _add_hint(problem, mdl, scratch.stage_of, scratch.device_of_stage)
    status = []
    best = (scratch.stage_of, scratch.device_of_stage)
    for objective, fix in ((sum(between), None), (sum(within), sum(between))):
        m.minimize(objective)
        solver, code = _solve(m, deadline.share(0.5 if fix is None else 1.0), seed)  # step 2 half, step 3 the rest
        status.append(solver.status_name(code))
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        raw = {v: next(k for k in range(mdl.num_stages) if solver.boolean_value(mdl.y[v][k])) for v in mdl.order}
        used = sorted(set(raw.values()))
        stage_of = {v: used.index(raw[v]) for v in problem.graph.nodes}
        devices = [next(d for d, lit in mdl.a[k].items() if solver.boolean_value(lit)) for k in used]
        best = (stage_of, devices)
        if fix is None:
            # Step 3 keeps step 2's bytes between machines (its optimum when OPTIMAL).
            m.add(sum(between) <= round(solver.objective_value))
            m.clear_hints()  # step 2's plan as step 3's hint (each literal once: co-located nodes share theirs)
            _add_hint(problem, mdl, stage_of, devices)
    return best, status


def chosen_plan(problem: Problem, scratch: Plan, stage_of: dict[str, int], devices: list[str]) -> Plan:
    """The Plan of a re-plan's choice, its costs from `evaluate`; its bound is the from-scratch plan's (a bound
    of every plan of the problem)."""
    stages = evaluate(problem, stage_of, devices)
    search = (f"re-planned (NOTE [lexicographic re-plan]): the fewest bytes moved within the slack of the "
              f"from-scratch plan, bottleneck {scratch.bottleneck_ns / 1000:.1f} us; its search: "
              f"{scratch.bounds.search or 'none'}") if scratch.bounds is not None else ""
    return Plan(stage_of=stage_of, device_of_stage=devices, stages=stages, bottleneck_ns=bottleneck_ns(stages),
                lower_bound_ns=scratch.lower_bound_ns, solver_status="FEASIBLE", solve_seconds=0.0,
                bounds=replace(scratch.bounds, search=search) if scratch.bounds is not None else None,
                certificate=None)


def holders_of(ranks: list[dict]) -> dict[str, tuple[str, ...]]:
    """weight -> the planned devices of the old ranks holding it, from an old manifest's `ranks`."""
    out: dict[str, list[str]] = {}
    for entry in ranks:
        for w in entry["weights"]:
            out.setdefault(w, []).append(entry["planned_device"])
    return {w: tuple(ds) for w, ds in out.items()}
