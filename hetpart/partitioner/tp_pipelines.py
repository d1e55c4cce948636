"""Data-parallel pipelines whose stages are tensor-parallel groups (DP x PP x TP): the planning half.

`plan_pipelines` (NOTE [pipeline shapes], NOTE [outer program]) searches over a problem's devices; given
the problem `--tensor-parallel T` plans on (NOTE [tensor-parallel costs] in passes/tp_lower.py: every
device a slot of T same-type devices in one machine, costed per rank), it searches pipelines of TP
groups with no change, and `choose_pipelines_degree` picks the degree. Nothing here imports torch.

NOTE [tensor-parallel pipelines]
A plan of degree T is a `PipelinesPlan` of the degree-T slot problem: each pipeline a set of TP-T
slots, each stage one slot. Every cost is one already defined for slots, per rank:
- a stage's compute, collectives (the TP all-reduces inside the group) and memory per rank are the
  slot problem's (NOTE [tensor-parallel costs]); a boundary is paid once over the link between
  the two groups' machines (each TP index's lane sends its own copy side by side);
- the gradient sync is NOTE [gradient sync] over the slots: NOTE [tensor-parallel gradient sync].
The degree is uniform over the plan: lane i of one pipeline's stage meets lane i of every other
pipeline's stage holding the same weights only when both split them the same way (one sharding per
degree, `passes/tensor_parallel.py`); degrees given per machine (`--tensor-parallel MACHINE=T,...`) mix
across pipelines with the slice groups of NOTE [mixed-degree gradient sync] (tp_sync.py). The plan space of
`choose_pipelines_degree` is the union of the degrees' spaces; its bound the least of theirs (each
degree's `plan_pipelines` bound covers every plan of its slot problem, NOTE [pipelines bound]; a
degree whose search found no plan gets `pipelines_lower_bound` on its own, and every degree NOTE [quick
pipelines bound], searched or not), so it stays valid, and
tests/partitioner/test_tp_pipelines.py checks bound <= optimum <= plan against brute force on small
slot problems. Ties go to the smaller degree. Devices used: a used slot is T devices.

NOTE [tensor-parallel gradient sync]
Rank i of a TP-T stage holds shard i of each weight the sharding splits (`tp_shard_bytes`: 1/T of the
bytes) and the whole of each weight it replicates; its gradient is all-reduced with rank i of every
other stage holding that weight (one ring per TP index, as Megatron-LM's data-parallel groups are
the ranks of one TP index). So a weight held by P slots costs T rings of P ranks each, each ring
carrying the per-rank bytes the slot problem already counts (`Problem.weights`: the shard, or the
whole replicated weight), the T rings side by side. How the rings share the inter-machine link:
the cluster models the network as one `Link` (`Cluster.network`, `Problem.network`; the presets'
"200 Gb/s Ethernet between machines", 25 GB/s) that every transfer and every ring gets in full:
NOTE [gradient sync] runs the rings of different devices at once, each over the full link, so today's
data-parallel plans (T = 1) already have 8 rings leaving one 8-GPU machine at 25 GB/s each. Pricing
the T lane rings the same way (each ring at the full link: one ring of the per-rank bytes) is
`grad_sync_ns` over the slots, unchanged, and keeps the comparison between degrees fair. Read as
one NIC per machine instead, both would be optimistic by the same factor per machine: a machine
whose devices all sit in network rings sends, per weight byte it holds, the same bytes at any degree
(T lanes of 1/T each against T devices' rings of their own layers), except that each lane of a TP
stage sends its whole replicated weights (norms, and the embedding or head where the sharding does
not split them): T copies where a degree-1 stage sends one. `benchmarks/dp_tp.py` prints the
per-machine reading (`grad_sync_nic_ns`) beside the plan's sync, so the difference is seen, not hidden.
The test checks the slot sync against T lane rings costed over the physical devices.

NOTE [degrees share the time limit]
`--time-limit` bounds the whole solve, so the degrees share it rather than each taking it:
1. Every degree's search-free bound first, NOTE [quick pipelines bound] (milliseconds per degree), so no
   degree is ever outside every bound: one not searched, or whose search ran out of time before its
   NOTE [pipelines bound] finished, keeps that bound (the larger of the two where both finished).
2. Degree 1 is searched first, with at least `_DEGREE1_PART` of the limit (more where its slots' share of
   all the degrees' slots is larger): `--max-tensor-parallel N` must not be worse than degree 1 alone, and
   before this order the higher degrees, searched first, overran their parts (fixed costs that do not
   shrink with the limit: llama-70b x hetero-256's degrees 8, 4 and 2 took 66 s of 45) and left degree 1
   unsearched, its plan a degree-4 baseline's 8.31 s against degree 1's 6.60 (docs/benchmarks.md, "scaletp").
3. Then the others, the most promising (least bound) first (fewest slots among equals), each given a part of
   what is left in proportion to its slots, but at least an equal part of it (what is left over the
   degrees left): the search's time grows with its slots, its fixed costs do not shrink with them, and in
   proportion alone the degree with the fewest slots, often the most promising, got too little to find a
   plan (the 405B-shaped model on hetero-256: degree 8, second in the order by bound, got 4.2 s of 45 and
   was not searched, while degree 2, whose plan was 2.1x slower, took 17.5 s; docs/benchmarks.md,
   "rows19"). Time a degree does not use goes to the degrees after it.
4. A degree whose bound is at least the best plan found so far cannot give a faster plan: it is not
   searched (pruned, certified by its bound, which stays in the least over the degrees and cannot lower it
   below the plan). A degree whose part is under `_LEAST_PART` of the limit is not searched either (its
   fixed costs would overrun it further): its bound is its search-free one, and the note says so.
5. Time left after the searches tightens the least bound: NOTE [pipelines bound] on the degree whose bound
   is least, until the deadline (a bound cut by the deadline is still a bound, the larger kept).
A degree's part covers its search, its bound (NOTE [bounds deadline]: the search gives its bound part of
its own limit) and its baselines; a degree whose search finds no plan computes its bound alone within
`_BOUND_SHARE` of its part. A degree may still overrun its part and take from the degrees after it. The
solve's lines print each degree's part and seconds, in the order searched.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hetpart.errors import HetpartError
from hetpart.partitioner.pipeline_bounds import PipelinesBound, pipelines_lower_bound
from hetpart.partitioner.pipeline_quick_bound import quick_pipelines_bound
from hetpart.partitioner.pipelines import Pipeline, PipelinesPlan, grad_sync_ns, sync_buckets
from hetpart.partitioner.problem import Problem

_DEGREE1_PART = 0.5  # degree 1's part of the limit at least, searched first
_BOUND_SHARE = 0.15  # a degree without a plan: its bound's part of its share (as NOTE [bounds deadline])
_LEAST_PART = 0.1  # a degree after the first left less than this part of the limit is not searched (at 0.05,
# llama-70b x hetero-256's degrees 2 and 4 took 9.8 and 6.9 s of 2.5 and 2.9 s parts: seconds of fixed costs)


@dataclass(frozen=True)
class DegreePipelines:
    """One degree's search (NOTE [tensor-parallel pipelines]): its plan (None: none found, `error` says why),
    the bound over its slot problem's plans, the seconds it took of the seconds it was given."""

    degree: int
    plan: PipelinesPlan | None
    bound_ns: int
    seconds: float
    error: str = ""
    share_s: float = 0.0  # its share of the time limit (NOTE [degrees share the time limit])
    note: str = ""  # what its bound covers, its slots read as TP groups
    unfinished: tuple[str, ...] = ()  # the parts of that bound its deadline cut (PipelinesBound.unfinished)


@dataclass(frozen=True)
class PipelinesDegreeChoice:
    """The degree kept and its plan, the bound and status over every degree, and each degree's result (in the order
    searched)."""

    degree: int
    plan: PipelinesPlan
    results: tuple[DegreePipelines, ...]


def choose_pipelines_degree(problems: Mapping[int, Problem], microbatches: int,
                            plan: Callable[[int, Problem, int, float], PipelinesPlan],
                            time_limit_s: float) -> PipelinesDegreeChoice:
    """NOTE [tensor-parallel pipelines]: `plan(degree, problem, microbatches, seconds)` on each degree's slot problem
    (degree 1: the devices'), the fastest plan kept (ties: the smaller degree), its bound the least over the degrees;
    the degrees share `time_limit_s` (NOTE [degrees share the time limit])."""
    t0 = time.perf_counter()
    end = t0 + time_limit_s
    # 1. Every degree's search-free bound, under the clock (none: bound 0, its part "search-free" cut).
    bounds: dict[int, PipelinesBound] = {}
    for t in sorted(problems):
        if time.perf_counter() > end:
            bounds[t] = PipelinesBound(0, 0, "no bound: the time limit ran out before its search-free bound", 0.0,
                                       ["search-free"])
            continue
        bounds[t] = quick_pipelines_bound(problems[t], microbatches)
    # 2-3. Degree 1 first, then the least bound first.
    rest = sorted((t for t in problems if t != 1), key=lambda t: (bounds[t].bound_ns, len(problems[t].devices), t))
    order = [t for t in (1, *rest) if t in problems]
    results: dict[int, DegreePipelines] = {}
    finished: set[int] = set()  # degrees whose NOTE [pipelines bound] finished
    best_ns: int | None = None
    for i, t in enumerate(order):
        start = time.perf_counter()
        bound = bounds[t]  # the degree's bound so far: its search's or its own where larger
        if best_ns is not None and bound.bound_ns >= best_ns:  # 4. it cannot give a faster plan
            results[t] = _result(t, None, bound, 0.0, f"pruned: its bound {bound.bound_ns:,} ns is at least the "
                                 f"best plan's {best_ns:,} ns (NOTE [degrees share the time limit])", 0.0)
            continue
        left = [len(problems[u].devices) for u in order[i:] if u not in results]
        share = max(0.0, end - start) * left[0] / max(1, sum(left))
        if t == 1:
            share = max(share, min(max(0.0, end - start), _DEGREE1_PART * time_limit_s))
        else:  # 3. at least an equal part of what is left, however few its slots
            share = max(share, max(0.0, end - start) / len(left))
        if results and share < _LEAST_PART * time_limit_s:  # too little left to search it: its quick bound, said so
            results[t] = _result(t, None, dataclasses.replace(
                bound, note=f"not searched (time limit), its search-free bound: {bound.note}"), 0.0,
                f"not searched: {share:.1f} s of the time limit left for it (NOTE [degrees share the time limit])",
                share)
            continue
        try:
            got = plan(t, problems[t], microbatches, share)
            error = ""
            if got.lower_bound_ns > bound.bound_ns:
                bound = dataclasses.replace(bound, bound_ns=got.lower_bound_ns, note=got.bound_note,
                                            unfinished=list(got.bound_unfinished))
                finished |= set() if bound.unfinished else {t}
            best_ns = got.iteration_ns if best_ns is None else min(best_ns, got.iteration_ns)
        except HetpartError as e:  # no plan found: the bound over this degree's plans on its own
            got, error = None, str(e).splitlines()[0]
            alone = pipelines_lower_bound(problems[t], microbatches,
                                          deadline=time.perf_counter() + _BOUND_SHARE * share)
            if alone.bound_ns > bound.bound_ns:
                bound = alone
            finished |= set() if alone.unfinished else {t}
        results[t] = _result(t, got, bound, time.perf_counter() - start, error, share)
    found = [r for r in results.values() if r.plan is not None]
    if not found:
        raise HetpartError(f"partitioner: no data-parallel pipelines of tensor-parallel degree "
                           f"{', '.join(str(t) for t in sorted(problems))} found: "
                           + "; ".join(f"degree {t}: {results[t].error}" for t in sorted(results)))
    best = min(found, key=lambda r: (r.plan.iteration_ns, r.degree))
    _tighten(problems, microbatches, results, finished, best.plan.iteration_ns, end)  # 5.
    ordered = tuple(results[t] for t in order)
    least = min(ordered, key=lambda r: (r.bound_ns, r.degree))
    lower = min(least.bound_ns, best.plan.iteration_ns)
    status = "OPTIMAL" if lower >= best.plan.iteration_ns else (
        best.plan.solver_status if best.plan.solver_status == "WITHIN_GAP" and lower == best.plan.lower_bound_ns
        else "FEASIBLE")
    note = (f"the least over tensor-parallel degrees {', '.join(str(t) for t in sorted(results))} of each degree's "
            f"bound (NOTE [tensor-parallel pipelines]), degree {least.degree}'s: {least.note}")
    return PipelinesDegreeChoice(best.degree, dataclasses.replace(
        best.plan, lower_bound_ns=lower, solver_status=status, bound_note=note, bound_unfinished=least.unfinished),
        ordered)


def _result(degree: int, plan: PipelinesPlan | None, bound: PipelinesBound, seconds: float, error: str,
            share_s: float) -> DegreePipelines:
    """A degree's `DegreePipelines`, its bound's note read as TP groups."""
    return DegreePipelines(degree, plan, bound.bound_ns, seconds, error, share_s, slots_note(bound.note, degree),
                           tuple(bound.unfinished))


def _tighten(problems: Mapping[int, Problem], microbatches: int, results: dict[int, DegreePipelines],
             finished: set[int], best_ns: int, end: float) -> None:
    """NOTE [degrees share the time limit] 5: while time is left, NOTE [pipelines bound] on the degree whose bound is
    least and below the plan, each degree once and none whose bound already `finished`."""
    tried = set(finished)
    while time.perf_counter() < end:
        open_ = [r for t, r in results.items() if t not in tried and r.bound_ns < best_ns]
        if not open_:
            return
        r = min(open_, key=lambda r: (r.bound_ns, r.degree))
        tried.add(r.degree)
        full = pipelines_lower_bound(problems[r.degree], microbatches, deadline=end, upper_ns=best_ns)
        if full.bound_ns > r.bound_ns:
            results[r.degree] = dataclasses.replace(r, bound_ns=full.bound_ns, note=slots_note(
                f"{full.note} (computed after the searches, NOTE [degrees share the time limit])", r.degree),
                unfinished=tuple(full.unfinished))


def slots_note(text: str, degree: int) -> str:
    """A slot problem's words (its bound's note, its idle reasons) read as groups: its "N devices" are N TP-`degree`
    groups (NOTE [tensor-parallel pipelines])."""
    if degree == 1:
        return text
    return re.sub(r"\b(\d[\d,]*) devices\b", rf"\1 tensor-parallel groups of {degree} devices", text)


def devices_used(plan: PipelinesPlan, degree: int) -> int:
    """The devices a plan of TP-`degree` slots runs stages on (NOTE [tensor-parallel pipelines])."""
    return degree * len(plan.used_devices)


def grad_sync_nic_ns(problem: Problem, pipelines: list[Pipeline], lanes: int = 1) -> int:
    """NOTE [tensor-parallel gradient sync]'s other reading of the network, an estimate beside the plan's cost (no
    solver uses it): one NIC per machine, shared by every ring leaving it. A ring over devices of several
    machines, laid out machine by machine, leaves each of them once, that hop carrying 2(r-1)/r of its bytes;
    each ring stands for `lanes` (a TP slot's rings, one per TP index). A machine's time is its hops' bytes
    over the network's bandwidth plus the latency steps of its device with the most; the step waits for the
    slowest machine, or for `grad_sync_ns` where that is slower (rings inside one machine)."""
    if problem.training is None:
        return 0
    load: dict[str, int] = {}  # machine -> bytes its NIC sends
    steps: dict[str, int] = {}  # device -> latency of its rings over the network
    for devs, nbytes in sync_buckets(problem, pipelines).items():
        machines = {problem.device(d).node for d in devs}
        if len(machines) < 2:
            continue
        r = len(devs)
        for m in machines:
            load[m] = load.get(m, 0) + lanes * -(-2 * (r - 1) * nbytes // r)
        for d in devs:
            steps[d] = steps.get(d, 0) + 2 * (r - 1) * problem.network.latency_ns
    worst = {m: 0 for m in load}
    for d, ns in steps.items():
        m = problem.device(d).node
        worst[m] = max(worst[m], ns)
    nic = max((-(-b * 1000 // problem.network.bandwidth_bytes_per_us) + worst[m] for m, b in load.items()), default=0)
    return max(nic, grad_sync_ns(problem, pipelines)[0])


__all__ = ["DegreePipelines", "PipelinesDegreeChoice", "choose_pipelines_degree", "devices_used", "grad_sync_nic_ns",
           "slots_note"]
