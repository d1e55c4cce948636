"""Audit the idle reasons of a `--parallel data` plan: does a plan that uses the idle devices beat it in
hetpart's own cost model?

    .venv/bin/python benchmarks/scale.py --parallel data --time-limit 45 --models llama-7b --presets hetero-64 \\
        --out /tmp/scale                                   # writes /tmp/scale/llama-7b-hetero-64
    .venv/bin/python benchmarks/idle_audit.py /tmp/scale/llama-7b-hetero-64 [more partition --out dirs]

Reads a partition's ir/analysis.json (the lowered problem), ir/pipelines.json (the chosen pipelines) and
plan.json (its step and idle reasons), recosts the chosen plan (it must give plan.json's step), then builds
the counter-plans a demanding user would try and costs each with the same formulas the search uses
(`evaluate` per stage, `cost_pipelines` for the step: slowest pipeline + the gradient sync across pipelines):

- own:     the chosen pipelines plus pipelines of the idle devices (one per idle machine, one per pair of
           idle machines of a kind, stripes across the idle machines of a kind, all idle devices as one),
           the batch split over all of them at the least time, every pipeline running at least its fewest
           microbatches (1F1B: as many as its stages);
- join:    idle devices given to the chosen pipelines (j more per pipeline, to one or to every pipeline),
           each joined pipeline planned again by the search's planner, and also the chosen plan with a new
           first or last stage on the added device (the best cut of the old first/last stage), the batch
           split again;
- stripe:  every machine cut into f stripes (f pipelines each taking 1/f of every machine);
- pair:    each idle machine paired with a used machine of another kind as one pipeline, the other used
           machines striped.
Each new pipeline is planned by the search's own planner (`_solve_shape_why`: the layer DP in the search's
device orders); pipelines of interchangeable machines are solved once and renamed. Every counter-plan is
checked by `pipelines_violations`. Prints one table per plan: its step, sync, slowest pipeline, and how much
slower (or faster) than the chosen plan.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetpart.errors import HetpartError  # noqa: E402
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate  # noqa: E402
from hetpart.partitioner.pipeline_bounds import need_bytes  # noqa: E402
from hetpart.partitioner.pipeline_layers import layer_problem  # noqa: E402
from hetpart.partitioner.pipeline_shape import _slow_first, _solve_shape_why, stash_ordered  # noqa: E402
from hetpart.partitioner.pipelines import (  # noqa: E402
    Pipeline, PipelinesPlan, cost_pipelines, pipeline_time_ns, pipelines_violations, sub_problem, used_devices)
from hetpart.partitioner.problem import Plan, Problem  # noqa: E402
from hetpart.partitioner.problem_json import problem_from_json  # noqa: E402
from hetpart.partitioner.replan_pipelines import pipeline_plan, pipelines_from_json  # noqa: E402
from hetpart.partitioner.solve import SolveOptions  # noqa: E402
from hetpart.partitioner.verify import plan_violations  # noqa: E402


@dataclasses.dataclass
class Part:
    """One pipeline of a counter-plan: its devices and the plans it may run (each valid from `lo` microbatches)."""

    devices: tuple[str, ...]
    plans: list[Plan]  # on `devices`; the split picks the fastest valid one for its share


def load(out: Path) -> tuple[Problem, PipelinesPlan, dict]:
    """The problem, the chosen plan (recosted) and plan.json of a partition's --out dir."""
    problem = problem_from_json(json.loads((out / "ir/analysis.json").read_text())["problem"])
    old = pipelines_from_json(json.loads((out / "ir/pipelines.json").read_text()), str(out / "ir/pipelines.json"))
    pipes = []
    for i, o in enumerate(old):
        plan = pipeline_plan(problem, o.devices, o.stage_of, o.device_of_stage, o.microbatches)
        pipes.append(Pipeline(i, o.devices, o.microbatches, plan, pipeline_time_ns(plan, o.microbatches)))
    return problem, cost_pipelines(problem, pipes, solver_status="FIXED"), json.loads((out / "plan.json").read_text())


class Planner:
    """The search's planner for one pipeline (`_solve_shape_why` on layers, in the search's device orders), its
    plans kept per (machine signature, microbatches) and renamed onto interchangeable devices."""

    def __init__(self, problem: Problem, limit_s: float) -> None:
        self.problem, self.limit_s = problem, limit_s
        self.opts = SolveOptions(time_limit_s=limit_s)
        self.layers = layer_problem(problem)
        t = problem.training
        self.ordered = ([stash_ordered(problem, self.layers, _slow_first(problem))]
                        if t is not None and t.schedule == "1f1b" else [])
        self.cache: dict = {}
        self.solves = 0
        kinds: dict[str, tuple] = {}
        for d in problem.devices:
            kinds.setdefault(d.node, ())
            kinds[d.node] += ((d.type, d.capacity_bytes),)
        self.machine_key = {m: (tuple(sorted(v)), problem.intra_node_links.get(m)) for m, v in kinds.items()}

    def canonical(self, devices: tuple[str, ...]) -> tuple[tuple, tuple[str, ...]]:
        """A signature shared by groups of interchangeable devices, and the group in the signature's order."""
        p = self.problem
        on: dict[str, list[str]] = {}
        for d in devices:
            on.setdefault(p.device(d).node, []).append(d)
        per = sorted(on.items(), key=lambda kv: (str(self.machine_key[kv[0]]),
                                                 tuple(sorted((p.device(d).type, p.device(d).capacity_bytes)
                                                              for d in kv[1]))))
        sig = tuple((str(self.machine_key[m]), tuple(sorted((p.device(d).type, p.device(d).capacity_bytes)
                                                             for d in ds))) for m, ds in per)
        order = tuple(d for _, ds in per for d in sorted(ds, key=lambda x: (p.device(x).type, x)))
        return sig, order

    def plan(self, devices: tuple[str, ...], m: int) -> Plan | None:
        """The search's plan of a pipeline on `devices` for `m` microbatches (None: none fits), on `devices`."""
        sig, order = self.canonical(devices)
        key = (sig, m)
        if key not in self.cache:
            self.solves += 1
            got = _solve_shape_why(self.problem, order, m, self.opts, self.limit_s, self.layers, self.ordered)
            self.cache[key] = (order, got.plan)
        base, plan = self.cache[key]
        if plan is None:
            return None
        rename = dict(zip(base, order))
        slots = [rename[s] for s in plan.slot_of_stage]
        return pipeline_plan(self.problem, devices, plan.stage_of, slots, m)


def fewest(problem: Problem, plan: Plan) -> int:
    """The fewest microbatches a pipeline plan runs (1F1B: as many as its stages)."""
    t = problem.training
    return len(plan.stages) if t is not None and t.schedule == "1f1b" else 1


def fits(problem: Problem, devices: tuple[str, ...], plan: Plan, m: int) -> Plan | None:
    """`plan` recosted for `m` microbatches, or None when it does not run them (stage count, memory)."""
    if m < fewest(problem, plan):
        return None
    got = pipeline_plan(problem, devices, plan.stage_of, plan.slot_of_stage, m)
    return None if plan_violations(sub_problem(problem, devices, m), got) else got


def best_split(problem: Problem, parts: list[Part], M: int) -> PipelinesPlan | None:
    """The parts' plan of least step with every part running at least its fewest microbatches and M in all, or
    None. A part's time for k microbatches is its fastest plan valid at k (not monotone in k: a plan of more stages
    starts at more microbatches), so the least slowest-pipeline time T is found by bisection over the times, each
    T checked exactly by which sums of one allowed k per part reach M (bit sets); the sync does not depend on
    the split."""
    def times(part: Part) -> list[float]:
        out = [math.inf] * (M + 1)
        for plan in part.plans:
            total = sum(s.time_ns for s in plan.stages)
            for k in range(max(1, fewest(problem, plan)), M + 1):
                out[k] = min(out[k], total + (k - 1) * plan.bottleneck_ns)
        return out

    table = [times(part) for part in parts]
    mask = (1 << (M + 1)) - 1

    def reach(T: float) -> list[int] | None:
        sets, got = [1], 1
        for t in table:
            nxt = 0
            for k in range(1, M + 1):
                if t[k] <= T:
                    nxt |= got << k
            got = nxt & mask
            if not got:
                return None
            sets.append(got)
        return sets if got >> M & 1 else None

    values = sorted({v for t in table for v in t if v < math.inf})
    if not values or reach(values[-1]) is None:
        return None
    lo, hi = 0, len(values) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reach(values[mid]) is not None else (mid + 1, hi)
    T = values[lo]
    sets = reach(T)
    assert sets is not None
    shares, left = [0] * len(parts), M
    for i in range(len(parts) - 1, -1, -1):  # back from the last part: a k whose rest the parts before reach
        k = next(k for k in range(1, left + 1) if table[i][k] <= T and sets[i] >> (left - k) & 1)
        shares[i], left = k, left - k
    pipes = []
    for i, (part, m) in enumerate(zip(parts, shares)):
        cands = sorted((p for p in part.plans if m >= fewest(problem, p)),
                       key=lambda p: sum(s.time_ns for s in p.stages) + (m - 1) * p.bottleneck_ns)
        plan = next((q for q in (fits(problem, part.devices, p, m) for p in cands) if q is not None), None)
        if plan is None:
            return None
        pipes.append(Pipeline(i, part.devices, m, plan, pipeline_time_ns(plan, m)))
    pp = cost_pipelines(problem, pipes, solver_status="FIXED")
    return None if pipelines_violations(problem, pp, M) else pp


def chosen_parts(chosen: PipelinesPlan) -> list[Part]:
    return [Part(p.devices, [p.plan]) for p in chosen.pipelines]


def idle_by_machine(problem: Problem, chosen: PipelinesPlan) -> dict[str, list[str]]:
    """The devices in no chosen pipeline, per machine (a device a pipeline holds but leaves out is its "left out"
    reason's, hedged: not audited here)."""
    held = {d for p in chosen.pipelines for d in p.devices}
    out: dict[str, list[str]] = {}
    for d in problem.devices:
        if d.name not in held:
            out.setdefault(d.node, []).append(d.name)
    return out


def interleaved(problem: Problem, idle: dict[str, list[str]]) -> list[str]:
    """The idle devices one machine after another per device index (l-0/0, l-1/0, l-0/1, ...)."""
    rows = list(idle.values())
    return [r[i] for i in range(max(map(len, rows), default=0)) for r in rows if i < len(r)]


def kind_key(problem: Problem, machine: str) -> tuple:
    return tuple(sorted((d.type, d.capacity_bytes) for d in problem.devices if d.node == machine))


def m_refs(problem: Problem, n: int, M: int) -> list[int]:
    """The microbatches a new pipeline of n devices is planned for (1F1B: its stages are at most that many):
    n, and its share of the batch were every pipeline like it (the search's choice), and half of n."""
    t = problem.training
    if t is None or t.schedule != "1f1b":
        return [M]
    share = M * n // len(problem.devices)
    return sorted({min(M, n), min(M, max(1, share)), min(M, max(1, n // 2))})


def new_part(problem: Problem, planner: Planner, devices: tuple[str, ...], M: int) -> Part | None:
    plans = [p for m in m_refs(problem, len(devices), M) if (p := planner.plan(devices, m)) is not None]
    return Part(devices, plans) if plans else None


def own_groups(problem: Problem, idle: dict[str, list[str]], need: int) -> list[tuple[str, list[tuple[str, ...]]]]:
    """Groupings of the idle devices into new pipelines (each group holding the model's memory in sum)."""
    by_kind: dict[tuple, list[str]] = {}
    for m in idle:
        by_kind.setdefault(kind_key(problem, m), []).append(m)
    cap = lambda g: sum(problem.device(d).capacity_bytes for d in g)  # noqa: E731
    out = []
    for machines in by_kind.values():
        name = problem.device(idle[machines[0]][0]).type
        per = [tuple(idle[m]) for m in machines]
        out.append((f"one pipeline per idle {name} machine", per))
        if len(machines) >= 2:
            pairs = [tuple(idle[a] + idle[b]) for a, b in zip(machines[::2], machines[1::2])]
            out.append((f"one pipeline per pair of idle {name} machines", pairs))
        n = min(len(idle[m]) for m in machines)
        for f in range(2, n + 1):
            if n % f == 0 and all(len(idle[m]) == n for m in machines):
                k = n // f
                stripes = [tuple(d for m in machines for d in idle[m][j * k:(j + 1) * k]) for j in range(f)]
                out.append((f"{f} stripes across the {len(machines)} idle {name} machines "
                            f"({len(stripes[0])} devices each)", stripes))
    if len(by_kind) > 1:  # one idle machine of every idle kind per pipeline
        rows = list(by_kind.values())
        mixed = [tuple(d for ms in rows for d in idle[ms[i]]) for i in range(min(map(len, rows)))]
        out.append((f"one pipeline per {len(rows)} idle machines of {len(rows)} kinds", mixed))
    every = tuple(d for ds in idle.values() for d in ds)
    if len(by_kind) > 1 or len(idle) > 2:
        out.append(("one pipeline of every idle device", [every]))
    got = []
    for label, groups in out:  # all the groups, half of them, one of them
        groups = [g for g in groups if cap(g) >= need and len(g) <= 128]
        if not groups:
            continue
        for k in sorted({len(groups), len(groups) // 2, 1} - {0}, reverse=True):
            got.append((label if k == len(groups) else f"{label}: {k} of its {len(groups)}", groups[:k]))
    return got


def appended(problem: Problem, p: Pipeline, extra: str, at_end: bool, step: int = 4) -> Plan | None:
    """`p`'s plan with a new last (or first) stage on `extra` taking the best suffix (prefix) of its last (first)
    stage's nodes in graph order, for p's microbatches; None when no cut gives a valid plan."""
    plan = p.plan
    k = len(plan.stages) - 1 if at_end else 0
    nodes = [v for v in problem.graph.nodes if plan.stage_of[v] == k]
    devices = tuple(p.devices) + (extra,)
    sub = sub_problem(problem, devices, p.microbatches)
    best = None
    cuts = range(1, len(nodes), step)
    for c in cuts:
        moved = set(nodes[c:]) if at_end else set(nodes[:c])
        if at_end:
            stage_of = {v: (k + 1 if v in moved else s) for v, s in plan.stage_of.items()}
            slots = list(plan.slot_of_stage) + [extra]
        else:
            stage_of = {v: (0 if v in moved else s + 1) for v, s in plan.stage_of.items()}
            slots = [extra] + list(plan.slot_of_stage)
        if len(slots) > (sub.max_stages or len(slots)):
            return None
        stages = evaluate(sub, stage_of, slots)
        if stages[-1 if at_end else 0].compute_ns == 0:
            continue  # a stage of no work (the input placeholder alone) runs nothing on the device
        q = Plan(stage_of=stage_of, slot_of_stage=slots, stages=stages, bottleneck_ns=bottleneck_ns(stages),
                 lower_bound_ns=0, solver_status="FEASIBLE", solve_seconds=0.0, objective="iteration",
                 microbatches=p.microbatches)
        t = pipeline_time_ns(q, p.microbatches)
        if (best is None or t < best[0]) and not plan_violations(sub, q):
            best = (t, q)
    return None if best is None else best[1]


def audit(out: Path, limit_s: float) -> list[dict]:
    t0 = time.perf_counter()
    try:
        problem, chosen, pj = load(out)
    except (KeyError, TypeError, ValueError) as e:  # not what `partition` writes (HetpartError: an old version)
        raise HetpartError(f"{out}: ir/analysis.json, ir/pipelines.json or plan.json is not what `hetpart partition "
                           f"... --parallel data` writes ({type(e).__name__}: {e}): partition again") from None
    M = chosen.microbatches
    want = round(pj["iteration_us"] * 1000)
    if abs(chosen.iteration_ns - want) > 1000:
        raise HetpartError(f"{out}: its pipelines recost to {chosen.iteration_ns / 1e6:,.1f} ms, plan.json says "
                           f"{want / 1e6:,.1f} ms (a plan of tensor-parallel slots, or another hetpart's): not audited")
    planner = Planner(problem, limit_s)
    need = need_bytes(problem)
    idle = idle_by_machine(problem, chosen)
    rows: list[dict] = []

    def add(family: str, label: str, parts: list[Part] | None, note: str = "") -> None:
        pp = best_split(problem, parts, M) if parts else None
        row = {"family": family, "plan": label, "note": note}
        if pp is not None:
            used = used_devices(pp.pipelines)
            slow = max(pp.pipelines, key=lambda p: p.time_ns)
            row.update(step_ns=pp.iteration_ns, sync_ns=pp.grad_sync_ns, slowest_ns=slow.time_ns,
                       slowest=f"{len(slow.plan.stages)} st x {slow.microbatches} mb",
                       pipelines=len(pp.pipelines), used=len(used),
                       vs=(pp.iteration_ns - chosen.iteration_ns) / chosen.iteration_ns)
        rows.append(row)

    rows.append({"family": "chosen", "plan": f"{len(chosen.pipelines)} pipeline(s), M={M}", "note": "",
                 "step_ns": chosen.iteration_ns, "sync_ns": chosen.grad_sync_ns,
                 "slowest_ns": max(p.time_ns for p in chosen.pipelines),
                 "slowest": "{} st x {} mb".format(*max(((len(p.plan.stages), p.microbatches) for p in
                                                         chosen.pipelines))),
                 "pipelines": len(chosen.pipelines), "used": len(chosen.used_devices), "vs": 0.0})
    base = chosen_parts(chosen)
    # own: the chosen pipelines plus pipelines of the idle devices.
    for label, groups in own_groups(problem, idle, need):
        parts = [new_part(problem, planner, g, M) for g in groups]
        if any(p is None for p in parts):
            add("own", label, None, "no plan fits in memory")
            continue
        add("own", "chosen + " + label, base + parts)  # type: ignore[operator]
    # join: idle devices given to the chosen pipelines.
    order = interleaved(problem, idle)
    P = len(chosen.pipelines)
    for j in sorted({1, 2, 4, 8, len(order) // P} - {0}):
        for k in sorted({1, P}):
            if j * k > len(order):
                continue
            joined, grew = [], []
            for i, p in enumerate(chosen.pipelines[:k]):
                extra = tuple(order[i * j:(i + 1) * j])
                devs = tuple(p.devices) + extra
                part = new_part(problem, planner, devs, M)
                plans = [q for q in (part.plans if part else []) if set(used_devices(
                    [Pipeline(0, devs, 1, q, 0)])) & set(extra)]
                joined.append(Part(devs, plans) if plans else None)
                grown = p
                for e in extra:  # the chosen plan with a stage on each added device, at its end or start
                    tries = [q for q in (appended(problem, grown, e, True), appended(problem, grown, e, False)) if q]
                    if not tries:
                        grown = None
                        break
                    q = min(tries, key=lambda q: pipeline_time_ns(q, grown.microbatches))
                    grown = Pipeline(0, tuple(grown.devices) + (e,), grown.microbatches, q,
                                     pipeline_time_ns(q, grown.microbatches))
                grew.append(Part(devs, [grown.plan]) if grown is not None else None)
            label = f"+{j} idle device(s) to {'each of the ' + str(k) if k > 1 else 'one of the'} chosen pipeline(s)"
            for how, parts in (("re-planned", joined), ("chosen plan + a first/last stage on each", grew)):
                if any(x is None for x in parts):
                    add("join", f"{label}, {how}", None, "no plan runs a stage on the added devices")
                else:
                    add("join", f"{label}, {how}", parts + base[k:])  # type: ignore[operator]
    # fewest: a pipeline with one idle device of each idle type running a stage, at its fewest microbatches (what
    # "every pipeline with a K machine takes at least T for its fewest microbatches" speaks of): the chosen
    # pipeline 0 with a first or last stage on it.
    p0 = chosen.pipelines[0]
    for dev_type in dict.fromkeys(problem.device(d).type for ds in idle.values() for d in ds):
        e = next(d for ds in idle.values() for d in ds if problem.device(d).type == dev_type)
        tries = [q for q in (appended(problem, p0, e, True), appended(problem, p0, e, False)) if q]
        label = f"pipeline 0 + a first/last stage on one idle {dev_type}, alone at its fewest microbatches"
        if not tries:
            rows.append({"family": "fewest", "plan": label, "note": "no valid cut"})
            continue
        q = min(tries, key=lambda q: pipeline_time_ns(q, fewest(problem, q)))
        lo = fewest(problem, q)
        t = pipeline_time_ns(q, lo)
        rows.append({"family": "fewest", "plan": label, "note": "", "step_ns": t, "sync_ns": 0, "slowest_ns": t,
                     "slowest": f"{len(q.stages)} st x {lo} mb", "pipelines": 1, "used": len(q.stages),
                     "vs": (t - chosen.iteration_ns) / chosen.iteration_ns})
    # stripe: every machine cut into f stripes.
    machines = list(dict.fromkeys(d.node for d in problem.devices))
    counts = {len([d for d in problem.devices if d.node == m]) for m in machines}
    n = math.gcd(*counts)
    for f in range(2, n + 1):
        if n % f:
            continue
        groups = [tuple(d for m in machines for d in [x.name for x in problem.devices if x.node == m][
            j * (len([x for x in problem.devices if x.node == m]) // f):(j + 1) * (
                len([x for x in problem.devices if x.node == m]) // f)]) for j in range(f)]
        if len(groups[0]) > 128:
            continue
        part = new_part(problem, planner, groups[0], M)
        if part is None:
            add("stripe", f"{f} stripes of every machine", None, "no plan fits")
            continue
        parts = []
        for g in groups:
            plans = [q for q in (planner.plan(g, pl.microbatches) for pl in part.plans) if q is not None]
            parts.append(Part(g, plans))
        add("stripe", f"{f} stripes of every machine ({len(groups[0])} devices each)", parts)
    # pair: each idle machine with a used machine of another kind; the other used machines striped.
    used_machines = sorted({problem.device(d).node for d in chosen.used_devices})
    idle_machines = [m for m in idle if len(idle[m]) == len([d for d in problem.devices if d.node == m])]
    kinds: dict[tuple, list[str]] = {}
    for m in used_machines:
        kinds.setdefault(kind_key(problem, m), []).append(m)
    for ms in kinds.values():
        if not idle_machines or len(ms) < len(idle_machines):  # no whole machine idle: no pair to make
            continue
        pairs = [tuple(idle[a]) + tuple(d.name for d in problem.devices if d.node == b)
                 for a, b in zip(idle_machines, ms)]
        rest = [m for m in used_machines if m not in ms[:len(idle_machines)]]
        pair_parts = [new_part(problem, planner, g, M) for g in pairs]
        if any(p is None for p in pair_parts):
            continue
        name = problem.device(pairs[0][-1]).type
        for f in (8, 4, 2):
            groups = [tuple(d for m in rest for d in [x.name for x in problem.devices if x.node == m][j::f])
                      for j in range(f)]
            if not rest or sum(problem.device(d).capacity_bytes for d in groups[0]) < need or len(groups[0]) > 128:
                continue
            first = new_part(problem, planner, groups[0], M)
            if first is None:
                continue
            parts = [Part(g, [q for q in (planner.plan(g, pl.microbatches) for pl in first.plans) if q is not None])
                     for g in groups]
            add("pair", f"idle machine + {name} machine x{len(pairs)}, rest in {f} stripes",
                pair_parts + parts)  # type: ignore[operator]
    # mix: copies of c machines of each kind of a set of kinds, as many as the machines allow, the batch split.
    by_kind: dict[tuple, list[str]] = {}
    for m in machines:
        by_kind.setdefault(kind_key(problem, m), []).append(m)
    names = {k: problem.device(next(d.name for d in problem.devices if d.node == ms[0])).type
             for k, ms in by_kind.items()}
    keys = list(by_kind)
    for r in range(2, len(keys) + 1):
        for subset in itertools.combinations(keys, r):
            for c in (1, 2):
                copies = min(len(by_kind[k]) // c for k in subset)
                if copies < 1:
                    continue
                groups = [tuple(d.name for k in subset for m in by_kind[k][i * c:(i + 1) * c]
                                for d in problem.devices if d.node == m) for i in range(copies)]
                if len(groups[0]) > 64 or sum(problem.device(d).capacity_bytes for d in groups[0]) < need:
                    continue
                first = new_part(problem, planner, groups[0], M)
                label = f"{copies} x ({' + '.join(f'{c} {names[k]}' for k in subset)} machines)"
                if first is None:
                    add("mix", label, None, "no plan fits")
                    continue
                parts = [Part(g, [q for q in (planner.plan(g, pl.microbatches) for pl in first.plans)
                                  if q is not None]) for g in groups]
                for k in sorted({copies, max(1, copies // 2)}, reverse=True):
                    add("mix", label if k == copies else f"{label}: {k} of them", parts[:k])
    print(f"# {out.name}: {len(problem.devices)} devices, {len(chosen.used_devices)} used, M={M}, "
          f"schedule {problem.training.schedule if problem.training else 'inference'}; "
          f"{planner.solves} pipeline solves, {time.perf_counter() - t0:.1f} s", flush=True)
    return rows


def print_rows(name: str, rows: list[dict]) -> None:
    print(f"\n{name}\n")
    print("| family | counter-plan | pipelines | used | slowest pipeline | its time ms | sync ms | step ms | "
          "vs chosen |")
    print("|---|---|---|---|---|---|---|---|---|")
    ms = lambda ns: f"{ns / 1e6:,.1f}"  # noqa: E731
    for r in rows:
        if "step_ns" not in r:
            print(f"| {r['family']} | {r['plan']} | - | - | - | - | - | {r['note'] or 'no plan'} | - |")
            continue
        print(f"| {r['family']} | {r['plan']} | {r['pipelines']} | {r['used']} | {r['slowest']} | "
              f"{ms(r['slowest_ns'])} | {ms(r['sync_ns'])} | {ms(r['step_ns'])} | {r['vs']:+.1%} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+", help="`hetpart partition ... --parallel data --out DIR` directories")
    ap.add_argument("--limit-s", type=float, default=5.0, help="seconds per pipeline solve")
    args = ap.parse_args()
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for d in args.dirs:
        out = Path(d)
        if not (out / "ir/analysis.json").exists() or not (out / "ir/pipelines.json").exists():
            print(f"idle_audit: {out} has no ir/analysis.json and ir/pipelines.json: give a directory "
                  "`hetpart partition ... --parallel data --out DIR` wrote", file=sys.stderr)
            sys.exit(2)
        try:
            rows = audit(out, args.limit_s)
        except HetpartError as e:
            print(f"idle_audit: {e}", file=sys.stderr)
            sys.exit(2)
        reasons: dict[str, int] = {}
        for why in json.loads((out / "plan.json").read_text()).get("devices_idle", {}).values():
            reasons[why] = reasons.get(why, 0) + 1
        for why, n in reasons.items():
            print(f"idle reason ({n} device(s)): {why}")
        print_rows(out.name, rows)
    print(f"\nload after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
