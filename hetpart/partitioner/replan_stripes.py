"""NOTE [re-plan pipelines] c, d and e (replan_pipelines.py): striped pipelines as re-plan candidates, stripe 0 solved
in the device orders of where the machines hold the model, then re-cut bytes-first. Nothing here imports torch."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hetpart.partitioner.pipelines import pipelines_violations, sub_problem
from hetpart.partitioner.problem import WEIGHTS, Plan, Problem
from hetpart.partitioner.problem import stage_weights
from hetpart.partitioner.replan import Moves, moves, relabel_stages
from hetpart.partitioner.replan_deadline import MIN_SOLVE_S, Deadline
from hetpart.partitioner.replan_pipelines import (
    PipelinesCandidate,
    pipeline_plan,
    pipelines_moves,
    relabeled,
    relabeled_plan,
)
from hetpart.partitioner.verify import plan_violations

_STRIPE_LIMIT_S = 1.0  # one stripe's solve at most (the search's _SHAPE_LIMIT_S; NOTE [re-plan pipelines] c)
_STRIPE_CAPS = (1.0, 0.5)  # NOTE [re-plan pipelines] d: bytes-first caps, step x (1 + this x slack)
_NEAR_S = 0.2  # NOTE [re-plan pipelines] e: seconds for the near orders, the first among them (each a few DPs)
_STEP_TRIES = 3  # NOTE [re-plan pipelines] d: bytes-first DPs per cap, each at the bottleneck the last's step left


def stripe_candidates(problem: Problem, holders: Mapping[str, tuple[str, ...]], microbatches: int, *,
                      deadline: Deadline, seed: int, memo=None, slack: float = 0.02,
                      left_out: list[str] | None = None) -> list[PipelinesCandidate]:
    """NOTE [re-plan pipelines] c: striped pipelines (NOTE [striped pipelines]) over every machine left, then over
    every machine left but one kind's, the most stripes each; stripe 0 from `memo` (NOTE [shape memo]) or solved by
    the search's planner in each of `_held_orders` within `deadline` (the first whatever the time, with its whole
    _STRIPE_LIMIT_S: a solve cut short lands its stages elsewhere; a memo plan was solved for other holdings), the
    solved ones added to `memo`; each as is and relabeled. After the first stripe plan's candidates, each next
    solved plan's only while `deadline` has time left, and the bytes-first re-cuts (NOTE [re-plan pipelines] d)
    and their candidates of every set but the first; what it cut is appended to `left_out` (NOTE [re-plan deadline]: the re-plan's note says
    it)."""
    from hetpart.partitioner.pipeline_bounds import need_bytes
    from hetpart.partitioner.pipeline_search import Shape, _class_devices, machine_kinds
    from hetpart.partitioner.pipeline_shape import _solve_shape
    from hetpart.partitioner.pipeline_stripes import stripe_devices, stripe_microbatches, stripe_sets, striped
    from hetpart.partitioner.replan_holdings import as_holdings
    from hetpart.partitioner.shape_memo import memo_codec, record_stripes, stripe_seeds
    from hetpart.partitioner.solve import SolveOptions

    held = as_holdings(problem, holders)  # once for every set: the holdings, and each machine's first held node
    first = _first_held(problem, held)
    kinds, kind_of = machine_kinds(problem)
    codec = memo_codec(memo, problem, microbatches, kinds, _class_devices, Shape)
    known: dict[tuple, list[Plan]] = {}
    for machines, f, plan in stripe_seeds(memo, codec, microbatches):
        known.setdefault((machines, f), []).append(plan)
    sets: list[tuple[tuple[str, ...], int]] = []
    for leave in [None] + list(range(len(kinds))):  # every machine, then every machine but one kind's
        on = {d.name for d in problem.devices if kind_of[d.node] != leave}
        machines = tuple(sorted({problem.device(d).node for d in on}))
        sets += [s for s in stripe_sets(problem, on) if s[0] == machines and s not in sets][:1]  # the most stripes
    need, orders, solved, out, done = need_bytes(problem), None, [], [], []
    lazy: dict[int, object] = {}  # each held order's layers
    for i, (machines, f) in enumerate(sets):
        groups = stripe_devices(problem, machines, f)
        if microbatches < f or sum(problem.device(d).capacity_bytes for d in groups[0]) < need:
            continue  # NOTE [pipelines bound] (f): no plan of it holds the model
        m = stripe_microbatches(problem, microbatches, f)
        plans = list(known.get((machines, f), []))  # the memo's, and the held orders' solved in time
        for k in range(3):
            if (i or k) and deadline.left() < MIN_SOLVE_S:
                break
            orders = orders or _held_orders(problem, first)
            if k >= len(orders):
                break
            prob, layers_of = orders[k]
            if k not in lazy:  # made when first solved in, once for every set
                lazy[k] = layers_of()
            layers = lazy[k]
            limit_s = _STRIPE_LIMIT_S if not (i or k) else min(_STRIPE_LIMIT_S, max(MIN_SOLVE_S, deadline.left()))
            plan = _solve_shape(prob, groups[0], m, SolveOptions(seed=seed), limit_s, layers)
            if plan is not None:
                plan = pipeline_plan(problem, groups[0], plan.stage_of, plan.slot_of_stage, m)  # costed on `problem`
                if any(q.stage_of == plan.stage_of and q.slot_of_stage == plan.slot_of_stage for q in plans):
                    continue  # another held order's plan already (one candidate each, not a table row twice)
                plans.append(plan)
                solved.append((machines, f, groups[0], plan, m))
        done.append((machines, f, groups, m, plans))
    # NOTE [re-plan pipelines] d after every set's solves, so that they keep the time they had without it.
    cut = {"stripe plan(s) not striped": 0, "stripe set(s) not re-cut bytes-first": 0}
    seen: set[tuple] = set()
    for n, (machines, f, groups, m, plans) in enumerate(done):
        if not n or deadline.left() >= MIN_SOLVE_S:  # the first set's whatever the time: its bytes-first
            # stripes were every one chosen on llama-7b's trace (replan5s), each past the stripes' deadline
            tagged = [(plan, "") for plan in plans] + [
                (plan, ", bytes-first") for plan in _bytes_first_stripes(problem, groups[0], plans, m, held, first,
                                                                         slack, deadline)]
        else:  # no time for the DPs (NOTE [re-plan deadline])
            tagged = [(plan, "") for plan in plans]
            cut["stripe set(s) not re-cut bytes-first"] += bool(plans)
        for plan, tag in tagged:
            if out and deadline.left() <= 0 and not (tag and not n):  # the first plan's, the first set's DPs
                cut["stripe plan(s) not striped"] += 1
                continue
            pp = striped(problem, groups, plan, microbatches)
            if pipelines_violations(problem, pp, microbatches):
                continue
            name = f"stripes: {f} x {len(plan.stages)} stages on {len(machines)} machines{tag}"
            moved = relabeled(problem, pp, held)
            tries = [(name, pp)]
            if any(tuple(q.plan.slot_of_stage) != r[2] for q, r in zip(pp.pipelines, moved)):
                tries.append((name + ", relabeled", relabeled_plan(problem, pp, held, "stripes relabeled", moved)))
            for how, got in tries:  # the first checked above; a plan met already is not a candidate twice
                if (sig := _signature(got)) in seen:
                    continue
                seen.add(sig)
                out.append(PipelinesCandidate(how, got, ["new"] * len(got.pipelines),
                                              pipelines_moves(problem, got, held), checked=got is pp))
    record_stripes(memo, codec, solved)
    if left_out is not None:
        left_out += [f"{n} {what} (past the deadline)" for what, n in cut.items() if n]
    return out


def _signature(pp) -> tuple:
    """What makes two stripe candidates the same plan: every pipeline's devices, cuts and microbatches."""
    return tuple((tuple(q.devices), q.microbatches, tuple(sorted(q.plan.stage_of.items())),
                  tuple(q.plan.slot_of_stage)) for q in pp.pipelines)


def _bytes_first_stripes(problem: Problem, devices: tuple[str, ...], plans: Sequence[Plan], microbatches: int,
                         held, first: Mapping[str, int], slack: float, deadline: Deadline) -> list[Plan]:
    """NOTE [re-plan pipelines] d: NOTE [re-plan DP]'s bytes-first cuts of stripe 0 (on `devices`, for
    `microbatches`) in the device order the holdings give (`_held_stripe_order`) under the fastest of `plans`'
    caps, then in each of `plans`' own orders relabeled under its caps (the one moving the fewest bytes first),
    the caps on the step (`pipeline_time_ns`) those of `_STRIPE_CAPS`, each met by up to `_STEP_TRIES` DPs whose
    bottleneck caps the last plan's step leaves; each plan found, costed on `problem`, within its step cap, moving
    fewer bytes than every one of `plans`, and valid. Between the held order and the solved ones, NOTE [re-plan
    pipelines] e's near orders on the machines the fastest uses, under its caps, for `_NEAR_S` at most and only
    within `deadline` (the first whatever the time). The solved orders only within `deadline`. `held`: the
    Holdings of every device; `first`: `_first_held`'s (both made once per re-plan, by `stripe_candidates`)."""
    from hetpart.partitioner.dp import order_tables

    if not plans:
        return []
    sub = sub_problem(problem, devices, microbatches)
    tab = order_tables(sub)  # `held`: holdings of every device: machines'
    order = {id(p): _relabeled_in(problem, devices, p, held) for p in plans}
    now = {id(p): _between_within(moves(problem, p.stage_of, order[id(p)], held)) for p in plans}
    fewest = min(now.values())
    fastest = min(plans, key=lambda p: p.objective_ns)  # the least step
    tables = {devices: (sub, tab, {v: j for j, v in enumerate(tab.order)})}  # per device set: the DP's sub-problem,
    # order tables and each node's place in their order
    jobs = [(_held_stripe_order(problem, devices, first), fastest, devices, "held")]
    # NOTE [re-plan pipelines] e: orders near the held one, on the machines the fastest solved stripe uses
    on = {problem.device(d).node for d in fastest.slot_of_stage}
    used = tuple(d for d in devices if problem.device(d).node in on)
    jobs += [(o, fastest, used, "near") for o in _near_orders(problem, [d for d in jobs[0][0] if d in used]
                                                            + [d for d in used if d not in jobs[0][0]])]
    jobs += [(order[id(p)], p, devices, "solved") for p in sorted(plans, key=lambda p: now[id(p)])]
    seen = {(tuple(sorted(p.stage_of.items())), tuple(order[id(p)])) for p in plans}
    best: dict[float, tuple[tuple[int, int], Plan]] = {}  # per cap share: the fewest bytes found
    near = None  # NOTE [re-plan pipelines] e: the near orders' own time, within `deadline`'s
    for i, (old_order, plan, on_devices, kind) in enumerate(jobs):
        if kind == "near":
            near = near or Deadline(min(_NEAR_S, deadline.left()))
            if i > 1 and near.left() <= 0:
                continue  # the first near order whatever the time
        always = kind != "solved"
        if not always and deadline.left() < MIN_SOLVE_S:
            break
        if on_devices not in tables:
            on_sub = sub_problem(problem, on_devices, microbatches)
            on_tab = order_tables(on_sub)
            tables[on_devices] = (on_sub, on_tab, {v: j for j, v in enumerate(on_tab.order)})
        job_sub, job_tab, at = tables[on_devices]
        own = [at[v] for v, k in plan.stage_of.items()
               if at[v] > 0 and plan.stage_of[job_tab.order[at[v] - 1]] != k]
        for j, share in enumerate(_STRIPE_CAPS):
            if not always and j and deadline.left() < MIN_SOLVE_S:  # the clock between caps too
                break
            step_cap = math.floor(plan.objective_ns * (1 + share * slack))  # NOTE [re-plan pipelines] d: the step
            cap = math.floor(plan.bottleneck_ns * (1 + share * slack))
            extra = own
            if kind != "solved":  # held and near orders: where a balanced plan in it cuts
                extra = own + _greedy_cuts(job_sub, job_tab, old_order, cap)
            for new, _ in _step_capped(problem, devices, job_sub, job_tab, held, old_order, extra, microbatches,
                                       step_cap, cap):
                key = (tuple(sorted(new.stage_of.items())), tuple(new.slot_of_stage))
                if key in seen:
                    continue
                seen.add(key)
                bw = _between_within(moves(problem, new.stage_of, list(new.slot_of_stage), held))
                if (new.objective_ns <= step_cap and bw < min(fewest, best.get(share, (fewest,))[0])
                        and not plan_violations(sub, new)):
                    best[share] = (bw, new)  # fewer bytes than any plan solved (moved on every replica)
    out = []
    for _, plan in best.values():
        if all(plan.stage_of != p.stage_of or plan.slot_of_stage != p.slot_of_stage for p in out):
            out.append(plan)
    return out


def _step_capped(problem: Problem, devices: tuple[str, ...], sub: Problem, tab, held, old_order: list[str],
                 own: list[int], microbatches: int, step_cap: int, cap: int) -> list[tuple[Plan, int]]:
    """NOTE [re-plan pipelines] d: NOTE [re-plan DP]'s bytes-first plans of stripe 0 (on `devices`; `sub`, `tab`
    its sub-problem and order tables) in `old_order`, each with the bottleneck cap it was found under: first `cap`,
    then the bottleneck at which the last plan's stages would meet `step_cap` (step = the stages' sum + (m - 1) x
    bottleneck: its sum taken as is), until a cap repeats, none is found, or `_STEP_TRIES` DPs. Each costed on
    `problem`; not filtered (the caller keeps those within `step_cap`)."""
    from hetpart.partitioner.replan_dp import bytes_first_plan

    out: list[tuple[Plan, int]] = []
    tried: set[int] = set()
    while cap > 0 and cap not in tried and len(tried) < _STEP_TRIES:
        tried.add(cap)
        got = bytes_first_plan(sub, tab, held, old_order, cap, own)
        if got is None:
            break
        stage_of = {v: k for k in range(len(got.devices)) for v in tab.order[got.cuts[k]:got.cuts[k + 1]]}
        new = pipeline_plan(problem, devices, stage_of, got.devices, microbatches)
        out.append((new, cap))
        fill = new.objective_ns - (microbatches - 1) * new.bottleneck_ns  # the stages' sum
        cap = (step_cap - fill) // max(1, microbatches - 1)
    return out


def _near_orders(problem: Problem, order: Sequence[str]) -> list[list[str]]:
    """NOTE [re-plan pipelines] e: `order` (devices), then each order with one machine's devices (a block, in
    `order`'s order) moved to another place among the machines or two machines' blocks swapped, the fewest
    places moved first; each once, `order` first."""
    blocks: list[list[str]] = []
    for d in order:
        if blocks and problem.device(blocks[-1][0]).node == problem.device(d).node:
            blocks[-1].append(d)
        else:
            blocks.append([d])
    out, seen = [], set()

    def add(bs: list[list[str]]) -> None:
        flat = tuple(d for b in bs for d in b)
        if flat not in seen:
            seen.add(flat)
            out.append(list(flat))

    near = [(abs(a - b), a, b, "move") for a in range(len(blocks)) for b in range(len(blocks)) if a != b]
    near += [(b - a, a, b, "swap") for a, b in itertools.combinations(range(len(blocks)), 2)]
    add(blocks)
    for _, a, b, how in sorted(near, key=lambda x: x[0]):  # the nearest first (NOTE [re-plan pipelines] e)
        bs = list(blocks)
        if how == "move":
            bs.insert(b, bs.pop(a))
        else:
            bs[a], bs[b] = bs[b], bs[a]
        add(bs)
    return out


def _greedy_cuts(sub: Problem, tab, order: Sequence[str], cap: int) -> list[int]:
    """NOTE [re-plan pipelines] e: hints for the DP, the cut positions of a plan on every device of `order` in
    turn whose stages each take at most `cap` (compute and both boundaries, costs.py's terms; memory not
    checked): each stage ending as late as it may (forward), and each starting as early as it may (backward),
    each pass up to the first stage it finds no place for. Not a proof of anything: a stage ending as late as it
    may can leave the next no node, and a boundary's time is not monotone in where it lies."""
    from hetpart.partitioner.costs import link_between, transfer_ns
    from hetpart.partitioner.dp import valid_cuts

    n, S = tab.n, len(order)
    valid = valid_cuts(tab)

    def boundary(k: int, at) -> np.ndarray:  # the boundary after stage k, at positions `at`
        return transfer_ns(link_between(sub, order[k], order[k + 1]), tab.cut_bytes[at], tab.cut_tensors[at])

    fw, start = [], 0
    for k in range(S - 1):
        comp = tab.comp[sub.slot(order[k]).type]
        js = np.arange(start + 1, n)
        took = (comp[js] - comp[start] + (boundary(k - 1, np.array([start]))[0] if k else 0) + boundary(k, js))
        ok = js[(took <= cap) & valid[js]]
        if not len(ok):
            break  # the DP decides (a stage ending later may have left the next one nothing, or a dear boundary)
        start = int(ok.max())
        fw.append(start)
    bw, end = [], n
    for k in range(S - 1, 0, -1):
        comp = tab.comp[sub.slot(order[k]).type]
        iis = np.arange(1, end)
        took = (comp[end] - comp[iis] + (boundary(k, np.array([end]))[0] if k < S - 1 else 0) + boundary(k - 1, iis))
        ok = iis[(took <= cap) & valid[iis]]
        if not len(ok):
            break
        end = int(ok.min())
        bw.append(end)
    return sorted(set(fw + bw))


def _first_held(problem: Problem, held) -> dict[str, int]:
    """Machine -> the first node, by its index in graph order, whose weight (a part of it) the machine holds
    (`held`: Holdings); machines that hold none are absent."""
    first: dict[str, int] = {}
    for i, v in enumerate(problem.graph.nodes):
        for w in problem.graph.nodes[v].get(WEIGHTS, ()):
            for part in held.parts.get(w, ()):
                for m in held.machines.get(part, ()):
                    first.setdefault(m, i)
    return first


def _held_stripe_order(problem: Problem, devices: Sequence[str], first: Mapping[str, int]) -> list[str]:
    """NOTE [re-plan pipelines] d: stripe 0's `devices` on machines that hold some weight, ordered by the first node
    (in graph order) whose weight their machine holds (`first`: `_first_held`'s); the others left out (the DP's
    free devices)."""
    on = [d for d in devices if problem.device(d).node in first]
    return sorted(on, key=lambda d: first[problem.device(d).node])  # stable: ties keep `devices`' order


def _relabeled_in(problem: Problem, devices: Sequence[str], plan: Plan, holders) -> list[str]:
    """NOTE [re-plan pipelines] d: the devices of stripe `plan` (on `devices`, stripe 0) relabeled for the fewest
    bytes (`relabel_stages`: machines of one kind swap whole), each then taken back to `devices`' device of the
    same machine and class (a stripe's devices of a class on a machine are interchangeable)."""
    new = relabel_stages(problem, stage_weights(problem, plan.stage_of), list(plan.slot_of_stage), holders)
    free: dict[tuple, list[str]] = {}
    for name in devices:
        d = problem.device(name)
        free.setdefault((d.node, d.type, d.capacity_bytes), []).append(name)
    out = []
    for name in new:
        d = problem.device(name)
        out.append(free[(d.node, d.type, d.capacity_bytes)].pop(0))
    return out


def _between_within(m: Moves) -> tuple[int, int]:
    return m.between_bytes, m.within_bytes


def _held_orders(problem: Problem, held_first: Mapping[str, int]) -> list[tuple[Problem, Callable[[], object]]]:
    """NOTE [re-plan pipelines] c: `problem` (and what makes its layers: 0.2 s each on llama-7b, so only for the
    orders solved in before the deadline) with its devices ordered by where their machines hold
    the model (by the first node, in graph order, whose weight a device of the machine holds; a machine that holds
    none just after one of its kind that does, else last): from the machine whose holdings come last to the
    first, then the other way, then as it is. The planner's device order steers which machine each stage lands
    on: llama-7b less s-0, the first of these gave the old stripes' machine order and 65 GiB moved between
    machines, the cluster's own order 316 GiB, at the same step. `held_first`: `_first_held`'s."""
    from hetpart.partitioner.pipeline_layers import layer_problem

    node_of = {d.name: d.node for d in problem.devices}
    first: dict[str, float] = dict(held_first)
    kind = {d.node: (d.type, d.capacity_bytes) for d in problem.devices}
    for m in sorted(set(node_of.values()) - set(first)):  # a machine that holds none: beside one of its kind
        first[m] = min((x for u, x in first.items() if kind[u] == kind[m] and u in node_of.values()),
                       default=float("inf")) + 0.5
    out, seen = [], []
    for sign in (-1, 1, None):
        devices = problem.devices if sign is None else sorted(
            problem.devices, key=lambda d: (first[d.node] == float("inf"), sign * min(first[d.node], 1e18)))
        if [d.name for d in devices] not in seen:
            seen.append([d.name for d in devices])
            prob = problem if sign is None else dataclasses.replace(problem, devices=list(devices))
            out.append((prob, functools.partial(layer_problem, prob)))
    return out
