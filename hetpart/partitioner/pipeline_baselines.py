"""What today's 3D planners would give on the same cluster, in hetpart's cost model (issue 19).

Printed beside a `plan_pipelines` answer; each is a `PipelinesPlan` costed by `cost_pipelines`
and checked by `pipelines_violations`, so the ratios compare like with like (NOTE [pipeline
baselines]). Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections import Counter
from dataclasses import dataclass

from hetpart.errors import HetpartError
from hetpart.partitioner.baselines import DATA_PARALLEL_STRATEGIES, _equal_blocks
from hetpart.partitioner.costs import allreduce_ns, held_weight_bytes, node_mem_bytes, node_time_ns, stash_microbatches
from hetpart.partitioner.evaluate import evaluate
from hetpart.partitioner.pipelines import (
    Pipeline, PipelinesPlan, _ring_link_over, cost_pipelines, pipeline_time_ns, pipelines_violations, sub_problem,
)
from hetpart.partitioner.problem import Plan, Problem, stage_weights
from hetpart.partitioner.solve import SolveOptions, solve

# NOTE [pipeline baselines]
# What a competent user of today's 3D planners runs on the cluster (issue 19: not a strawman):
# - megatron: Megatron-LM's 3D layout without tensor parallelism: dp pipelines of pp stages on consecutive
#   devices, the same number of blocks per stage (NOTE [equal blocks] in baselines.py), the batch split equally
#   (the first M mod dp pipelines one microbatch more). Where the even split does not fit a pipeline's memory
#   (1F1B: stage k stashes pp - k microbatches, so stage 0 of llama-70b holds about 80 blocks' activations at
#   every pp, 107-135 GiB of 80), the most even split that fits: each stage in turn the most blocks under the
#   least cap on blocks per stage for which all fit (bisection), as a Megatron-LM user gives the first stages
#   fewer layers (uneven layers per stage) when the even split runs out of memory.
# - metis: Metis-style heterogeneity-aware splits on the same layouts: each stage gets blocks in proportion
#   to its device's speed (1 / the model's time on its type), or where that does not fit, the split whose
#   slowest stage compute is least among those that fit (as above, the cap on compute); the microbatches
#   split so that the slowest pipeline's time (fill plus a bottleneck per microbatch) is least, one at a time to
#   the pipeline done first (before, in proportion to 1 / the bottleneck: a slow pipeline's fill then made it
#   the slowest, and metis kept to the fastest machines; llama-70b x hetero-1024, 8 H100 pipelines of 32).
# - one-pipeline: today's `solve` on every device, for the iteration objective of all M
#   microbatches (NOTE [objectives]): `--parallel pipeline`.
# The machines a user picks: the pipelines are laid along the devices fastest first, largest memory first and in
# cluster order (each order once; cluster order ties kept), a pipeline that does not fit is left out (the user
# runs on the machines that hold the model; before, the first such pipeline in cluster order ended the layouts of
# its pp), and each (pp, dp) takes the dp fastest pipelines. Pipeline lengths below the total held bytes over
# the largest device are not tried (none holds every weight); the lengths that take whole machines or an equal
# part of one come first, then the others. A layout's memory is counted from per-block sums (activations of one
# microbatch, weights and state), the stash of its pipeline's own microbatches where that matters (GPipe: all
# of its share, not all M); the counts are `evaluate`'s where no weight is read in two blocks, else they
# overstate and `evaluate` decides. The best over every (pp, dp) with pp x dp <= the devices: all pairs are
# ranked by their slowest pipeline plus a sync estimate (each stage's weights all-reduced over the dp pipelines
# across the slowest link between their machines; without it llama-7b x hetero-64's metis recosted only pp=2
# layouts of 10-16 pipelines, whose sync made them 1.17x slower than pp=4, dp=4), the best TOP_EXACT recosted
# with their gradient sync, and the fastest that passes `pipelines_violations` kept.
# A pipeline's plan is costed once per distinct device signature (types, capacities, machine
# boundaries) and microbatch count, also when the best pairs are recosted (the stages renamed
# onto each pipeline's devices), so a 1,024-device cluster costs a few hundred evaluations, not
# D log D; only the kept layout is checked by `pipelines_violations`, and the ranking and the
# recosting stop at the baseline's deadline once one layout is ranked, the ranking at the deadline
# itself when none is: then the baseline has no plan and says it stopped at its deadline ("no layout
# fits" is never a deadline's; proving it took 32 s past a 1.8 s deadline on llama-70b x
# hetero-256's 256 devices, before the memory counts). The baseline `--strategy NAME` writes runs with no
# deadline: the plan a user runs does not change with --time-limit.

# NOTE [baseline deadline]
# Each baseline keeps to its share of `pipeline_baselines`' limit or does not begin (issue 19: every step of the
# solve respects --time-limit): a layout baseline whose deadline has passed when it is reached does no work at
# all (its block split alone took 0.5-1 s on llama-70b's 3,690 nodes; megatron and metis now share one split),
# and the one-pipeline baseline is not begun when nothing is left of the baselines' limit (before, it was given
# at least 0.5 s). Not kept to: once begun, its `solve` does 2-7 s of fixed work whatever its limit (the DP's
# order tables, the bounds' data), 2.5 s with 1.1 s left on a TP degree's part of llama-70b x hetero-256; no
# estimate the search has predicts it (its shapes are solved on layers, in three device orders), and leaving
# it out where it would have ended in time changes the baselines a plan is compared with (docs/benchmarks.md,
# "limit19"). A baseline left out says so in its note; the plan and its bound do not change. The layout
# baselines' plans are checked by `pipelines_violations` when found (`checked`), so the caller does not check
# them again (0.2-0.7 s each on 3,690 nodes).

TOP_EXACT = 8  # (pp, dp) pairs recosted exactly, with sync


@dataclass
class PipelinesBaseline:
    """One baseline: its plan (None when it has none for this problem) and what it is."""

    name: str
    plan: PipelinesPlan | None
    note: str
    checked: bool = False  # `plan` passed `pipelines_violations` already (NOTE [baseline deadline])


def _signature(problem: Problem, devices: list[str]) -> tuple:
    ds = [problem.device(d) for d in devices]
    same = tuple(a.node == b.node for a, b in zip(ds, ds[1:]))
    links = tuple(problem.intra_node_links.get(d.node) for d in ds)
    return tuple((d.type, d.capacity_bytes) for d in ds), same, links


def _blocks_of(problem: Problem) -> tuple[list[str], list[int], int]:
    """(node order, each node's block index, blocks): NOTE [equal blocks]'s blocks, one stage each."""
    many = dataclasses.replace(problem, max_stages=None)
    order = problem.node_order()
    probe = dataclasses.replace(many, devices=list(problem.devices) * (1 + problem.graph.number_of_nodes()
                                                                       // max(1, len(problem.devices))))
    stage_of, blocks, _ = _equal_blocks(probe) if len(probe.devices) else ({}, 0, "")
    return order, [stage_of[v] for v in order], blocks


def _stage_of(order: list[str], block: list[int], sizes: list[int]) -> dict[str, int]:
    """Consecutive runs of `sizes[k]` blocks per stage."""
    stage_at: list[int] = []
    for k, n in enumerate(sizes):
        stage_at += [k] * n
    return {v: stage_at[b] for v, b in zip(order, block)}


def _proportional(total: int, weights: list[float], least: int = 1) -> list[int] | None:
    """`total` split in proportion to `weights`, each at least `least`, largest remainders first."""
    if total < least * len(weights) or not weights:
        return None
    spare = total - least * len(weights)
    raw = [spare * w / sum(weights) for w in weights]
    out = [least + int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: int(raw[i]) - raw[i])[: total - sum(out)]:
        out[i] += 1
    return out


def _user_orders(problem: Problem, type_time: dict[str, int]) -> list[list[str]]:
    """NOTE [pipeline baselines]: the device orders a user lays pipelines along (fastest first, largest memory
    first, then the cluster's own), each once."""
    index = {d.name: i for i, d in enumerate(problem.devices)}
    keys = (lambda d: (type_time[d.type], -d.capacity_bytes, index[d.name]),
            lambda d: (-d.capacity_bytes, type_time[d.type], index[d.name]), lambda d: index[d.name])
    out: list[list[str]] = []
    for key in keys:
        order = [d.name for d in sorted(problem.devices, key=key)]
        if order not in out:
            out.append(order)
    return out


class _Blocks:
    """Prefix sums over the blocks of NOTE [equal blocks], per device type: activation bytes of one microbatch,
    held bytes (a weight counted in every block that reads it: never below a stage's own count; `exact` when no
    weight is read in two blocks, so a stage's count is `evaluate`'s memory) and compute."""

    def __init__(self, problem: Problem, order: list[str], block: list[int], blocks: int):
        self.problem, self.blocks = problem, blocks
        self.nodes: list[list[str]] = [[] for _ in range(blocks)]
        for v, b in zip(order, block):
            self.nodes[b].append(v)
        self.sums: dict[str, tuple[list[int], list[int], list[int]]] = {}
        self.read_in = [problem.weights_read(nodes) for nodes in self.nodes]
        self.exact = sum(map(len, self.read_in)) == len(set().union(*self.read_in))  # no weight read in two blocks

    def of(self, t: str) -> tuple[list[int], list[int], list[int]]:
        if t not in self.sums:
            act, held, time_ = [0], [0], [0]
            for nodes, ws in zip(self.nodes, self.read_in):
                act.append(act[-1] + sum(node_mem_bytes(self.problem, v, t) for v in nodes))
                held.append(held[-1] + sum(held_weight_bytes(self.problem, w, t) for w in ws))
                time_.append(time_[-1] + sum(node_time_ns(self.problem, v, t) for v in nodes))
            self.sums[t] = act, held, time_
        return self.sums[t]

    def fits(self, sub: Problem, devs: list[str], sizes: list[int]) -> bool:
        """Whether every stage of `sizes` holds its memory on its device by the counts above (at least the exact)."""
        a = 0
        for k, (d, n) in enumerate(zip(devs, sizes)):
            dev = sub.device(d)
            act, held, _ = self.of(dev.type)
            if stash_microbatches(sub, k, len(sizes)) * (act[a + n] - act[a]) + held[a + n] - held[a] > \
                    dev.capacity_bytes:
                return False
            a += n
        return True

    def fitted(self, sub: Problem, devs: list[str], speed_aware: bool) -> list[int] | None:
        """The most even split of the blocks over `devs` (by block count, or by compute with `speed_aware`) whose
        every stage holds its memory by the counts above: each stage in turn takes the most blocks under the
        least cap T for which they all fit (found by bisection); None when none does."""
        S, B = len(devs), self.blocks
        devices = [sub.device(d) for d in devs]
        stash = [stash_microbatches(sub, k, S) for k in range(S)]

        def split(cap: int) -> list[int] | None:
            a, out = 0, []
            for k, dev in enumerate(devices):
                act, held, time_ = self.of(dev.type)
                n = 0
                while (a + n + 1 <= B - (S - k - 1)
                       and (time_[a + n + 1] - time_[a] if speed_aware else n + 1) <= cap
                       and stash[k] * (act[a + n + 1] - act[a]) + held[a + n + 1] - held[a] <= dev.capacity_bytes):
                    n += 1
                if n == 0:
                    return None
                out.append(n)
                a += n
            return out if a == B else None

        hi = max(self.of(d.type)[2][B] for d in devices) if speed_aware else B
        if split(hi) is None:
            return None
        lo = 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if split(mid) is not None else (mid, hi)
        return split(hi)


def _balanced(total: int, plans: list[Plan], least: int) -> list[int] | None:
    """`total` microbatches over the pipelines of `plans`, each at least `least`, the slowest pipeline's time
    (its stages' sum plus a bottleneck per further microbatch) least: one at a time to the one done first."""
    if total < least * len(plans) or not plans:
        return None
    out = [least] * len(plans)
    fill = [sum(s.time_ns for s in p.stages) - p.bottleneck_ns for p in plans]
    heap = [(fill[j] + (least + 1) * p.bottleneck_ns, j) for j, p in enumerate(plans)]
    heapq.heapify(heap)
    for _ in range(total - least * len(plans)):
        _, j = heapq.heappop(heap)
        out[j] += 1
        heapq.heappush(heap, (fill[j] + (out[j] + 1) * plans[j].bottleneck_ns, j))
    return out


def _layout_baseline(problem: Problem, M: int, name: str, speed_aware: bool,
                     deadline: float | None) -> tuple[PipelinesPlan | None, str]:
    """NOTE [pipeline baselines]'s megatron (speed_aware False) or metis: the best (pp, dp) found by `deadline`
    (None: every layout, as `--strategy NAME` runs it), and why there is none when there is none."""
    if deadline is not None and time.perf_counter() >= deadline:  # NOTE [baseline deadline]: not begun
        return None, ("no (pp, dp) layout found before its deadline: it had passed when the baseline was reached, "
                      "so none was tried (NOTE [baseline deadline])")
    # The blocks once for both baselines (0.4 s on 3,690 nodes; NOTE [problem caches]).
    key = (id(problem.graph), problem.graph.number_of_nodes(), id(problem.devices), len(problem.devices))
    order, block, blocks = problem.kept("equal blocks", key, lambda: _blocks_of(problem))
    D = len(problem.devices)
    one_f1b = problem.training is not None and problem.training.schedule == "1f1b"
    by_share = problem.training is not None and not one_f1b  # the stash grows with the pipeline's microbatches
    type_time = {t: sum(node_time_ns(problem, v, t) for v in problem.graph.nodes) for t in problem.device_types}
    sums = _Blocks(problem, order, block, blocks)
    # Every stage holds each weight it reads: fewer stages than this cannot hold them all on the largest device.
    least_pp = max(1, -(-sum(held_weight_bytes(problem, w) for w in problem.weights)
                        // max(1, max(d.capacity_bytes for d in problem.devices))))
    cache: dict[tuple, tuple[Plan, bool]] = {}

    def costed(devs: list[str], sizes: list[int], m: int) -> tuple[Plan, bool]:
        key = (_signature(problem, devs), tuple(sizes), m if by_share else 0)
        if key not in cache:
            stage_of = _stage_of(order, block, sizes)
            stages = evaluate(sub_problem(problem, devs, m), stage_of, devs)
            plan = Plan(stage_of=stage_of, device_of_stage=devs, stages=stages,
                        bottleneck_ns=max(s.time_ns for s in stages), lower_bound_ns=0, solver_status="BASELINE",
                        solve_seconds=0.0, objective="iteration", microbatches=1)
            cache[key] = (plan, all(st.memory_bytes <= st.capacity_bytes for st in stages))  # checked at the end
        return cache[key]  # (a plan on the first devices of this signature: renamed when recosted)

    splits: dict[tuple, list[int] | None] = {}

    def pipeline(devs: list[str], pp: int, m: int) -> tuple[Plan | None, bool]:
        """The user's split on `devs` for `m` microbatches: the plain one, or the most even one that fits."""
        key = (_signature(problem, devs), m if by_share else 0)
        if key not in splits:
            splits[key] = _split(devs, pp, m)
        sizes = splits[key]
        return (None, False) if sizes is None else costed(devs, sizes, m)

    def _split(devs: list[str], pp: int, m: int) -> list[int] | None:
        if speed_aware:
            sizes = _proportional(blocks, [1.0 / max(1, type_time[problem.device(d).type]) for d in devs])
        else:
            sizes = [blocks * (k + 1) // pp - blocks * k // pp for k in range(pp)]
        sub = sub_problem(problem, devs, m)
        plain = sizes is not None and 0 not in sizes
        if plain and sums.fits(sub, devs, sizes):
            return sizes
        fitted = sums.fitted(sub, devs, speed_aware)
        if fitted is not None:
            return fitted
        return sizes if plain and not sums.exact else None  # the counts overstate shared weights: evaluate decides

    held: dict[int, int] = {}

    def stage_bytes(plan: Plan) -> int:
        """The most weight bytes a stage of `plan` holds: its share of the gradient sync."""
        if id(plan) not in held:
            held[id(plan)] = max(sum(problem.weights[w] for w in ws) for ws in stage_weights(problem, plan.stage_of)
                                 .values())
        return held[id(plan)]

    ranked = []
    start = time.perf_counter()
    rank_end = None if deadline is None else start + 0.6 * (deadline - start)  # the rest: recost with sync
    tried = 0  # pipeline lengths tried: short of all when the deadline came before any layout was ranked
    orders = _user_orders(problem, type_time)
    # The lengths a user tries first: whole machines, or an equal part of one; then the others (under a deadline,
    # 70b x hetero-256's first lengths that fit, 22-27, are 1.7x slower than the best, 28-32).
    per_machine = set(Counter(d.node for d in problem.devices).values())
    lengths = range(least_pp, min(D, blocks) + 1)
    aligned = [pp for pp in lengths if any(pp % n == 0 or n % pp == 0 for n in per_machine)]
    for pp in aligned + [pp for pp in lengths if pp not in aligned]:
        if ranked and rank_end is not None and time.perf_counter() > rank_end:
            break
        if deadline is not None and time.perf_counter() > deadline:  # none ranked: "none fits" is not known, said so
            break  # (llama-70b x hetero-256: 32 s past a 1.8 s deadline proving that no layout fits, before)
        tried += 1
        m0 = max(M, pp) if not by_share else -(-M // min(M, D // pp))  # the fewest a pipeline of pp gets
        for devices in orders:
            pipes: list[tuple[list[str], Plan]] = []
            for j in range(D // pp):
                if ranked and rank_end is not None and time.perf_counter() > rank_end:
                    break  # the pipelines costed so far are this pp's layouts (an evaluation: 0.18 s on 3,690 nodes)
                devs = devices[j * pp:(j + 1) * pp]
                plan, fits = pipeline(devs, pp, m0)
                if fits:  # a pipeline that does not fit is left out: the user runs on the machines that hold it
                    pipes.append((devs, plan))
            pipes.sort(key=lambda dp_: (dp_[1].bottleneck_ns, sum(s.time_ns for s in dp_[1].stages)))  # fastest first
            for dp in range(1, min(len(pipes), M) + 1):
                chosen = pipes[:dp]
                if speed_aware:
                    shares = _balanced(M, [p for _, p in chosen], pp if one_f1b else 1)
                else:
                    shares = [M // dp + (j < M % dp) for j in range(dp)]
                if shares is None or (one_f1b and min(shares) < pp):
                    continue
                if by_share:  # the stash of each pipeline's own share (GPipe: all of them)
                    chosen = [(devs, pipeline(devs, pp, m)) for (devs, _), m in zip(chosen, shares)]
                    if not all(fits for _, (_, fits) in chosen):
                        continue
                    chosen = [(devs, plan) for devs, (plan, _) in chosen]
                worst = max(sum(s.time_ns for s in p.stages) + (m - 1) * p.bottleneck_ns
                            for (_, p), m in zip(chosen, shares))
                if problem.training is not None and dp > 1:  # the sync, as if every pipeline split as the first
                    ring = _ring_link_over(problem, [problem.device(devs[0]).node for devs, _ in chosen])
                    worst += allreduce_ns(ring, stage_bytes(chosen[0][1]), dp)
                ranked.append((worst, pp, dp, shares, chosen))
    costed_layouts = []
    recosted: dict[tuple, tuple[list[str], list]] = {}  # (signature, plan, m) -> the first devices' stages
    for worst, pp, dp, shares, chosen in sorted(ranked, key=lambda r: r[:3])[:TOP_EXACT]:
        if costed_layouts and deadline is not None and time.perf_counter() > deadline:
            break
        out = []
        for j, ((devs, plan), m) in enumerate(zip(chosen, shares)):
            key = (_signature(problem, devs), id(plan), m)
            if key not in recosted:  # one evaluation per signature (NOTE [pipeline baselines])
                recosted[key] = (devs, evaluate(sub_problem(problem, devs, m), plan.stage_of, devs))
            first, stages = recosted[key]
            if first != devs:
                stages = [dataclasses.replace(st, device=devs[k], slot=devs[k], devices=(devs[k],))
                          for k, st in enumerate(stages)]
            p = dataclasses.replace(plan, device_of_stage=list(devs), stages=stages, microbatches=m,
                                    objective_ns=pipeline_time_ns(dataclasses.replace(plan, stages=stages), m))
            out.append(Pipeline(index=j, devices=tuple(devs), microbatches=m, plan=p, time_ns=p.objective_ns))
        costed_layouts.append(cost_pipelines(problem, out, solver_status="BASELINE",
                                             bound_note=f"{name}: pp={pp}, dp={dp} (NOTE [pipeline baselines])"))
    # Checked the fastest first, until one passes (each check re-evaluates every pipeline: minutes on 1,024
    # devices; a layout the counts let through and the exact memory does not is the rare one checked past).
    bad: list[str] = []
    for got in sorted(costed_layouts, key=lambda g: g.iteration_ns):
        why = pipelines_violations(problem, got, M)
        if not why:
            return got, ""
        bad = bad or why
    if bad:
        return None, f"its best layout breaks {len(bad)} rule(s): {'; '.join(bad[:2])}"
    shares = "shares by pipeline speed" if speed_aware else "equal batch shares"
    if not ranked and tried < len(lengths):
        return None, (f"no (pp, dp) layout with {shares} found before its deadline ({tried} of the {len(lengths)} "
                      f"pipeline lengths from {least_pp} to {min(D, blocks)} tried, none fits in memory)")
    return None, (f"no (pp, dp) layout fits in memory with {shares}" +
                  (" and at least as many microbatches per pipeline as stages (1F1B)" if one_f1b else ""))


def single_pipeline(problem: Problem, M: int, options: SolveOptions | None = None, **overrides) -> PipelinesPlan:
    """Today's plan: one pipeline on every device, solved for the iteration objective of M microbatches."""
    devs = [d.name for d in problem.devices]
    sub = sub_problem(problem, devs, M)
    opts = dataclasses.replace(options or SolveOptions(), **overrides) if overrides else options or SolveOptions()
    plan = solve(sub, dataclasses.replace(opts, objective="iteration", microbatches=M))
    pipe = Pipeline(index=0, devices=tuple(devs), microbatches=M, plan=plan, time_ns=pipeline_time_ns(plan, M))
    return cost_pipelines(problem, [pipe], solver_status=plan.solver_status, lower_bound_ns=plan.lower_bound_ns,
                          bound_note="one pipeline on every device (NOTE [pipeline baselines])")


def pipeline_baselines(problem: Problem, microbatches: int, time_limit_s: float = 30.0,
                       options: SolveOptions | None = None, single: bool = True,
                       exact: str | None = None) -> list[PipelinesBaseline]:
    """NOTE [pipeline baselines], each within its share of `time_limit_s` (megatron and metis a quarter
    each, one-pipeline the half; `single` False leaves one-pipeline out: `solve` on a thousand devices
    overruns its limit by minutes); a baseline with no valid plan has `plan` None and says why. Baseline
    `exact` (megatron or metis, the one `--strategy` writes) ranks every layout whatever the limit; the others
    keep to their deadlines or are not begun (NOTE [baseline deadline])."""
    t0 = time.perf_counter()
    out = []
    for name, aware, share in (("megatron", False, 0.25), ("metis", True, 0.5)):
        got, why = _layout_baseline(problem, microbatches, name, aware,
                                    None if name == exact else t0 + share * time_limit_s)
        out.append(PipelinesBaseline(name, got, got.bound_note if got else why, checked=got is not None))
    if not single:
        out.append(PipelinesBaseline("one-pipeline", None, f"not run: one pipeline over {len(problem.devices)} "
                                     "devices is not solved for the comparison (its solve overruns the limit)"))
        return out
    left = time_limit_s - (time.perf_counter() - t0)
    if exact is None and left <= 0:  # NOTE [baseline deadline]
        out.append(PipelinesBaseline("one-pipeline", None, f"not run: nothing was left of the baselines' "
                                     f"{time_limit_s:.2g} s when megatron and metis ended (NOTE [baseline deadline])"))
        return out
    try:
        single = single_pipeline(problem, microbatches, options, time_limit_s=left if exact is None else max(0.5, left))
        out.append(PipelinesBaseline("one-pipeline", single, single.bound_note))
    except HetpartError as e:
        out.append(PipelinesBaseline("one-pipeline", None, str(e).splitlines()[0]))
    return out


def strategy_pipelines(problem: Problem, microbatches: int, name: str, options: SolveOptions | None = None, *,
                       time_limit_s: float) -> tuple[PipelinesPlan, list[PipelinesBaseline]]:
    """`--parallel data --strategy NAME`: the plan of data-parallel baseline `name` (NOTE [--strategy] in
    baselines.py), and every baseline beside it (`pipeline_baselines` within `time_limit_s`). Status BASELINE
    with no bound; each device it leaves out says so. An error where the baseline has no plan."""
    if name not in DATA_PARALLEL_STRATEGIES[1:]:
        raise HetpartError(f"--strategy {name}: not a data-parallel baseline ({', '.join(DATA_PARALLEL_STRATEGIES[1:])})")
    baselines = pipeline_baselines(problem, microbatches, time_limit_s=time_limit_s, options=options,
                                   single=name == "one-pipeline" or len(problem.devices) <= 128, exact=name)
    b = next(b for b in baselines if b.name == name)
    if b.plan is None:
        raise HetpartError(f"--strategy {name}: no plan for this model and cluster ({b.note}); pick another "
                           "--strategy")
    bad = [] if b.checked else pipelines_violations(problem, b.plan, microbatches)
    if bad:  # megatron and metis are checked when found; the one-pipeline solve is checked here
        raise HetpartError(f"--strategy {name}: its plan breaks {len(bad)} rule(s) ({'; '.join(bad[:3])}); pick "
                           "another --strategy")
    layout = b.plan.bound_note.split(" (NOTE")[0]
    idle = {d: f"--strategy {name} ({layout}): {why}" for d, why in b.plan.devices_idle.items()}
    plan = dataclasses.replace(b.plan, lower_bound_ns=0, solver_status="BASELINE", devices_idle=idle,
                               bound_note=f"--strategy {name} ({layout}): a baseline's plan, no bound")
    return plan, baselines
