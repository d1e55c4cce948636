"""The outer program of the pipelines search (NOTE [outer program]): how many pipelines of each
solved shape, and their microbatches, for the least step; and the answer on real devices.
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from hetpart.partitioner.evaluate import evaluate
from hetpart.partitioner.infeasible import PipelinesRefused
from hetpart.partitioner.pipelines import Pipeline, grad_sync_ns, pipeline_time_ns, sub_problem, weight_holders
from hetpart.partitioner.problem import Link, Plan, Problem

# NOTE [outer program]
# CP-SAT over the solved shapes s (NOTE [pipeline shapes]; stage times summing to sum_s,
# bottleneck b_s, S_s stages): x_s pipelines of shape s, each running at most q_s microbatches
# (at least S_s under 1F1B, whose plans need as many microbatches as stages), t_s of them in all
# (lo_s x_s <= t_s <= q_s x_s, with a literal per value of x_s so the model stays linear;
# sum_s t_s = M). Machines of each kind go to whole-machine pipelines or to a pattern of pieces
# (a maximal multiset of pieces that fits one machine). The step is Z = T + Y with
# T >= sum_s + (q_s - 1) b_s and Y >= y_s(k) for every shape used, k = sum_s x_s pipelines.
# y_s(k) bounds from above the gradient sync of shape s's devices in any plan of k pipelines
# (NOTE [gradient sync]): each weight in a bucket of its own (merging buckets only saves
# latency), with k times the most holders any shape gives it, over the slowest link; with one
# pipeline, its own sync exactly. Times enter in units of 1/10,000 of the first answer's step,
# rounded up. So the true step (`cost_pipelines`, which the search then checks with
# `pipelines_violations`) is never above the model's Z, and differs from it by the bucket
# latencies and the rounding; Z's optimum is the best mix of these shapes up to those.
# A greedy answer (`greedy_outer`: whole-machine pipelines by rate per device while machines
# last, the best prefix of them, the microbatches split for the least step) hints the model; of
# the two answers the one with the lower true step is kept, so a model that runs out of time on a
# loaded machine leaves the greedy plan, not its first poor solution.

# NOTE [outer horizon]
# T's upper bound (the horizon) must admit every candidate at its most microbatches as the constraint
# charges it: up(sum_s - b_s) + up(b_s) q_s, each term rounded up on its own. Rounded once, as
# up(sum_s + (q_s - 1) b_s), it can be a unit or two less, and when the only mix that runs the batch is the
# candidate defining it, CP-SAT proved the model INFEASIBLE and the search refused the batch for memory:
# the 405B-shaped model at tensor-parallel degree 8 on hetero-256, whose 24-slot pipeline runs all 8
# microbatches (3,980 ms) but needed 12,749 units against a horizon of 12,748 (docs/benchmarks.md, "rows19").

_MAX_PATTERNS = 2_000  # piece patterns per machine kind at most


@dataclass
class Candidate:
    """One solved shape: its canonical devices and plan."""

    shape: object  # pipeline_search.Shape
    devices: tuple[str, ...]
    plan: Plan
    m_ref: int  # the microbatches it was solved for
    lo: int  # fewest microbatches its plan runs (its stages under 1F1B)
    hi: int  # most microbatches its plan's memory allows
    sum_ns: int
    bottleneck_ns: int
    sync_ns: list[int] = field(default_factory=list)  # y_s(k), k = 0..kmax

    @property
    def piece_kind(self) -> int:
        return self.shape.piece_kind  # type: ignore[attr-defined]


def kinds_of(shape) -> set[int]:
    """The machine kinds a shape (pipeline_search.Shape) has devices of."""
    return {shape.piece_kind} if shape.piece_kind >= 0 else {i for i, n in enumerate(shape.machines) if n}


def candidate(problem: Problem, shape, devs: tuple[str, ...], plan: Plan | None, m_ref: int,
              microbatches: int) -> Candidate | None:
    """A shape's candidate from its plan solved for `m_ref` microbatches, or None when there is no plan or it runs
    no share of the batch: 1F1B runs any m from its stage count up, GPipe any m up to `m_ref` (the stash)."""
    if plan is None:
        return None
    sched = problem.training.schedule if problem.training is not None else None
    lo = len(plan.stages) if sched == "1f1b" else 1
    hi = m_ref if sched == "gpipe" else microbatches
    if lo > hi:
        return None
    return Candidate(shape, devs, plan, m_ref, lo, hi, sum(st.time_ns for st in plan.stages), plan.bottleneck_ns)


def sync_estimates(problem: Problem, cands: list[Candidate], kmax: int) -> None:
    """Fill each candidate's y_s(k) of NOTE [outer program], k = 0..kmax."""
    if problem.training is None:
        for c in cands:
            c.sync_ns = [0] * (kmax + 1)
        return
    pipes = [Pipeline(0, c.devices, c.m_ref, c.plan, 0) for c in cands]
    holders = [weight_holders(problem, [p]) for p in pipes]
    most: dict[str, int] = {}
    for h in holders:
        for w, devs in h.items():
            most[w] = max(most.get(w, 0), len(devs))
    links = [problem.network, *problem.intra_node_links.values()]
    slowest = Link(min(x.bandwidth_bytes_per_us for x in links), max(x.latency_ns for x in links))
    for c, pipe, h in zip(cands, pipes, holders):
        per_device: dict[str, list[str]] = {}
        for w, devs in h.items():
            for d in devs:
                per_device.setdefault(d, []).append(w)
        out = [0, grad_sync_ns(problem, [pipe])[0]]
        ks = np.arange(2, kmax + 1, dtype=np.int64)[:, None]
        worst = np.zeros(len(ks), dtype=np.int64)
        for ws in per_device.values():
            nbytes = np.array([problem.weights[w] for w in ws], dtype=np.int64)[None, :]
            r = ks * np.array([most[w] for w in ws], dtype=np.int64)[None, :]
            moved = -(-2 * (r - 1) * nbytes // r)  # allreduce_ns, for every k and weight at once
            t = np.where((r > 1) & (nbytes > 0), 2 * (r - 1) * slowest.latency_ns
                         + -(-moved * 1000 // slowest.bandwidth_bytes_per_us), 0)
            worst = np.maximum(worst, t.sum(axis=1))
        out += [int(v) for v in worst]
        c.sync_ns = out[: kmax + 1]


def _patterns(counts: tuple[int, ...], pieces: list[tuple[int, ...]]) -> list[list[int]]:
    """Maximal multisets of `pieces` (devices per class) that fit a machine of `counts`: how many of each."""
    out: list[list[int]] = []

    def grow(start: int, left: tuple[int, ...], have: list[int]) -> None:
        if len(out) >= _MAX_PATTERNS:
            return
        fits = [j for j in range(len(pieces)) if all(a <= b for a, b in zip(pieces[j], left))]
        if not fits:
            out.append(list(have))
            return
        for j in fits:
            if j < start:
                continue
            have[j] += 1
            grow(j, tuple(b - a for a, b in zip(pieces[j], left)), have)
            have[j] -= 1

    if pieces:
        grow(0, counts, [0] * len(pieces))
    return [p for p in out if any(p)]


def patterns_per_kind(kinds: list, cands: list[Candidate]) -> dict[int, list[int]]:
    """Kind (a machine kind with `counts`) -> the piece counts of its patterns (how many pipelines one machine of it
    can host)."""
    out = {}
    for j, kind in enumerate(kinds):
        pieces = [c.shape.piece for c in cands if c.shape.piece_kind == j]
        out[j] = [sum(p) for p in _patterns(kind.counts, pieces)]
    return out


@dataclass
class OuterAnswer:
    """The outer program's choice: pipelines per candidate, their microbatches, the patterns used."""

    copies: list[int]  # x_s
    microbatches: list[int]  # t_s
    patterns: dict[int, list[tuple[list[int], int]]]  # kind -> (pattern, machines using it)
    piece_index: dict[int, list[int]]  # kind -> the candidates that are its pieces, in pattern order
    step_units: int
    unit_ns: int
    optimal: bool


def solve_outer(kinds, cands: list[Candidate], M: int, kmax: int, time_limit_s: float, seed: int = 0,
                workers: int = 1, unit_ns: int = 1, hint: OuterAnswer | None = None) -> OuterAnswer | None:
    """NOTE [outer program] in `unit_ns` units, started from `hint` (copies and microbatches per candidate);
    None when none was found in time; HetpartError when CP-SAT proves that no mix runs the batch."""
    up = lambda ns: -(-int(ns) // unit_ns)  # noqa: E731 (round up: the model never underestimates)
    m = cp_model.CpModel()
    # The most T any candidate's constraint below can ask, rounded as it is (NOTE [outer horizon]).
    horizon = max(up(c.sum_ns - c.bottleneck_ns) + up(c.bottleneck_ns) * c.hi for c in cands)
    sync_top = max(up(max(c.sync_ns)) for c in cands)
    # --- Variables.
    T = m.new_int_var(0, horizon, "pipelines")
    Y = m.new_int_var(0, sync_top, "sync")
    k = m.new_int_var(1, kmax, "k")
    x = [m.new_int_var(0, kmax, f"x{i}") for i in range(len(cands))]
    q = [m.new_int_var(c.lo, c.hi, f"q{i}") for i, c in enumerate(cands)]
    t = [m.new_int_var(0, M, f"t{i}") for i in range(len(cands))]
    # --- Constraints.
    # The pipelines run the whole batch.
    m.add(sum(t) == M)
    m.add(sum(x) == k)
    for i, c in enumerate(cands):
        # x_s = n for exactly one n; its pipelines run between lo_s and q_s microbatches each.
        most = min(kmax, M // max(1, c.lo))
        count = [m.new_bool_var(f"x{i}={n}") for n in range(most + 1)]
        m.add_exactly_one(count)
        m.add(x[i] == sum(n * lit for n, lit in enumerate(count)))
        m.add(t[i] == 0).only_enforce_if(count[0])
        for n, lit in enumerate(count[1:], start=1):
            m.add(t[i] <= n * q[i]).only_enforce_if(lit)
        m.add(t[i] >= c.lo * x[i])
        used = ~count[0]
        # The slowest pipeline and the slowest sync bound the step.
        m.add(T >= up(c.sum_ns - c.bottleneck_ns) + up(c.bottleneck_ns) * q[i]).only_enforce_if(used)
        sync = m.new_int_var(0, sync_top, f"y{i}")
        m.add_element(k, [up(v) for v in c.sync_ns], sync)
        m.add(Y >= sync).only_enforce_if(used)
    # Each machine goes to one whole-machine pipeline or to one pattern of pieces.
    patterns: dict[int, list[list[int]]] = {}
    piece_index: dict[int, list[int]] = {}
    w: dict[tuple[int, int], cp_model.IntVar] = {}
    for j, kind in enumerate(kinds):
        idx = [i for i, c in enumerate(cands) if c.piece_kind == j]
        piece_index[j] = idx
        patterns[j] = _patterns(kind.counts, [cands[i].shape.piece for i in idx])  # type: ignore[attr-defined]
        for p in range(len(patterns[j])):
            w[j, p] = m.new_int_var(0, len(kind.machines), f"w{j}_{p}")
        for slot, i in enumerate(idx):
            # A piece pipeline takes a slot of some machine's pattern.
            m.add(x[i] <= sum(patterns[j][p][slot] * w[j, p] for p in range(len(patterns[j]))))
        whole = [c.shape.machines[j] * x[i] for i, c in enumerate(cands) if c.piece_kind < 0]  # type: ignore
        m.add(sum(whole) + sum(w[j, p] for p in range(len(patterns[j]))) <= len(kind.machines))
    # --- Objective.
    m.minimize(T + Y)
    if hint is not None:
        for i, c in enumerate(cands):
            n, total = hint.copies[i], hint.microbatches[i]
            m.add_hint(x[i], n)
            m.add_hint(t[i], total)
            m.add_hint(q[i], max(c.lo, min(c.hi, -(-total // n) if n else c.lo)))
        m.add_hint(k, max(1, sum(hint.copies)))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, time_limit_s)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = seed
    status = solver.solve(m)
    if status == cp_model.INFEASIBLE:
        raise PipelinesRefused(
            f"partitioner: no mix of the {len(cands)} solved pipeline shapes runs the {M} microbatches: each "
            f"shape's plan runs at most {max(c.hi for c in cands)} (the stash of its microbatches fills its "
            "memory) and the machines do not hold enough of them; use fewer microbatches, or add memory", len(cands))
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return OuterAnswer(
        copies=[solver.value(v) for v in x], microbatches=[solver.value(v) for v in t],
        patterns={j: [(patterns[j][p], solver.value(w[j, p])) for p in range(len(patterns[j]))
                      if solver.value(w[j, p])] for j in patterns},
        piece_index=piece_index, step_units=int(solver.objective_value), unit_ns=unit_ns,
        optimal=status == cp_model.OPTIMAL)


def realize(problem: Problem, kinds, cands: list[Candidate], answer: OuterAnswer, shape_devices, class_devices
            ) -> list[Pipeline]:
    """The answer's pipelines on real devices: canonical machines mapped to free machines of their kind
    (NOTE [pipeline shapes]), each candidate's microbatches split as evenly as its copies allow."""
    free = {j: list(k.machines) for j, k in enumerate(kinds)}
    out: list[Pipeline] = []

    def shares(i: int) -> list[int]:
        n, total = answer.copies[i], answer.microbatches[i]
        return [total // n + (r < total % n) for r in range(n)]

    for i, c in enumerate(cands):
        if c.piece_kind >= 0:
            continue
        for m in shares(i):
            use = {j: [free[j].pop(0) for _ in range(n)] for j, n in enumerate(c.shape.machines)}  # type: ignore
            out.append(renamed(problem, c, shape_devices(problem, kinds, c.shape, use), m, len(out)))
    for j, kind in enumerate(kinds):
        left = {i: shares(i) for i in answer.piece_index[j] if answer.copies[i]}
        for pattern, machines in answer.patterns.get(j, []):
            for _ in range(machines):
                machine = free[j].pop(0)
                devs = class_devices(problem, kind, machine)
                taken = [0] * len(kind.counts)
                for slot, i in enumerate(answer.piece_index[j]):
                    for _ in range(pattern[slot]):
                        if not left.get(i):
                            continue
                        piece = cands[i].shape.piece  # type: ignore[attr-defined]
                        names = tuple(d for cls, n in enumerate(piece) for d in devs[cls][taken[cls]: taken[cls] + n])
                        taken = [a + b for a, b in zip(taken, piece)]
                        out.append(renamed(problem, cands[i], names, left[i].pop(0), len(out)))
    return out


def renamed(problem: Problem, c: Candidate, devices: tuple[str, ...], m: int, index: int) -> Pipeline:
    """`c`'s plan on `devices` (its canonical devices mapped in order) for `m` microbatches, recosted."""
    rename = dict(zip(c.devices, devices))
    slots = [rename[s] for s in c.plan.slot_of_stage]
    stages = evaluate(sub_problem(problem, devices, m), c.plan.stage_of, slots)
    value = pipeline_time_ns(dataclasses.replace(c.plan, stages=stages), m)
    plan = dataclasses.replace(c.plan, device_of_stage=slots, stages=stages, microbatches=m, objective_ns=value,
                               lower_bound_ns=0, solver_status="FEASIBLE", certificate=None)
    return Pipeline(index=index, devices=devices, microbatches=m, plan=plan, time_ns=value)


def _split(cands: list[Candidate], chosen: list[int], M: int) -> tuple[int, list[int]] | None:
    """The least pipeline time T (ns) at which the pipelines `chosen` (candidate per pipeline) run M
    microbatches, each between its lo and hi, and their microbatches at T; None when they cannot."""
    def room(T: int) -> list[int]:
        out = []
        for i in chosen:
            c = cands[i]
            most = (T - (c.sum_ns - c.bottleneck_ns)) // max(1, c.bottleneck_ns)
            out.append(min(c.hi, most) if most >= c.lo else 0)
        return out

    if sum(cands[i].lo for i in chosen) > M or sum(cands[i].hi for i in chosen) < M:
        return None
    lo, hi = 0, max(cands[i].sum_ns + (cands[i].hi - 1) * cands[i].bottleneck_ns for i in chosen)
    if sum(room(hi)) < M:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if sum(room(mid)) >= M else (mid + 1, hi)
    got = room(lo)
    extra = sum(got) - M
    for j in sorted(range(len(chosen)), key=lambda j: got[j]):  # take back the surplus from the smallest shares
        take = min(extra, got[j] - (cands[chosen[j]].lo if got[j] else 0))
        got[j] -= take
        extra -= take
    if any(g and g < cands[i].lo for g, i in zip(got, chosen)):
        return None
    return lo, got


def greedy_outer(kinds, cands: list[Candidate], M: int, kmax: int) -> OuterAnswer | None:
    """A quick answer to NOTE [outer program] that CP-SAT starts from (and that stands when CP-SAT finds
    nothing better in time): whole-machine pipelines taken by their rate per device while machines last,
    then the best prefix of them with the microbatches split for the least step."""
    whole = [i for i, c in enumerate(cands) if c.piece_kind < 0]
    if not whole:
        return None
    free = [len(k.machines) for k in kinds]
    rate = sorted(whole, key=lambda i: cands[i].bottleneck_ns * len(cands[i].devices))
    picked: list[int] = []
    for i in rate:
        need = cands[i].shape.machines  # type: ignore[attr-defined]
        while len(picked) < min(kmax, M) and all(f >= n for f, n in zip(free, need)):
            free = [f - n for f, n in zip(free, need)]
            picked.append(i)
    best = None
    for j in range(1, len(picked) + 1):
        got = _split(cands, picked[:j], M)
        if got is None:
            continue
        T, shares = got
        used = [i for i, s in zip(picked[:j], shares) if s]
        k = len(used)
        step = T + max(cands[i].sync_ns[min(k, len(cands[i].sync_ns) - 1)] for i in used)
        if best is None or step < best[0]:
            best = (step, picked[:j], shares)
    if best is None:
        return None
    step, chosen, shares = best
    copies, micro = [0] * len(cands), [0] * len(cands)
    for i, s in zip(chosen, shares):
        if s:
            copies[i] += 1
            micro[i] += s
    return OuterAnswer(copies=copies, microbatches=micro, patterns={}, piece_index={j: [] for j in range(len(kinds))},
                       step_units=step, unit_ns=1, optimal=False)


def one_machine_mixes(problem: Problem, kinds, cands: list[Candidate], M: int, class_devices,
                      keep: int = 3) -> list[list[Pipeline]]:
    """Plans of pieces of one machine only (NOTE [outer program]'s patterns of one kind, on its first machine),
    the `keep` fastest per kind by `_split`: the outer program charges every sync the slowest link, but the
    pieces of one machine sync over its own (small_problem(15) in the tests: two devices of one machine,
    one pipeline each, beat one pipeline of both by a third)."""
    out: list[list[Pipeline]] = []
    for j, kind in enumerate(kinds):
        index = [i for i, c in enumerate(cands) if c.piece_kind == j]
        if len(index) < 1:
            continue
        ranked = []
        for pattern in _patterns(kind.counts, [cands[i].shape.piece for i in index]):  # type: ignore[attr-defined]
            chosen = [i for i, n in zip(index, pattern) for _ in range(n)]
            got = _split(cands, chosen, M) if len(chosen) >= 2 else None
            if got is not None:
                ranked.append((got[0], chosen, got[1]))
        for _, chosen, shares in sorted(ranked, key=lambda r: r[0])[:keep]:
            devs = class_devices(problem, kind, kind.machines[0])
            taken = [0] * len(kind.counts)
            pipes: list[Pipeline] = []
            for i, m in zip(chosen, shares):
                piece = cands[i].shape.piece  # type: ignore[attr-defined]
                names = tuple(d for cls, n in enumerate(piece) for d in devs[cls][taken[cls]: taken[cls] + n])
                taken = [a + b for a, b in zip(taken, piece)]
                if m:
                    pipes.append(renamed(problem, cands[i], names, m, len(pipes)))
            out.append(pipes)
    return out
