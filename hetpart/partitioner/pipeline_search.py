"""The search for data-parallel pipelines of different shapes (issue 19): `plan_pipelines`.

Devices of one class (type and capacity, on a machine of one kind: machines with the same
devices and link are interchangeable) need not be told apart, so the search works on pipeline
*shapes* -- a number of whole machines of each kind, or a piece of one machine -- not on device
sets (NOTE [pipeline shapes]). Each shape is solved once by `solve` on a canonical device set
(cached; the shapes whose memory cannot hold the model are never tried), and an outer CP-SAT
program picks how many pipelines of each shape run, and their microbatches, for the least step
time (NOTE [outer program]). The bound is NOTE [pipelines bound] (pipeline_bounds.py), over
every plan, not only these shapes. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from dataclasses import dataclass

from hetpart.errors import HetpartError
from hetpart.partitioner.infeasible import PipelinesRefused, check_holds_model, no_shape_refusal
from hetpart.partitioner.pipeline_bounds import _supports, need_bytes, pipelines_lower_bound, sync_floor_ns
from hetpart.partitioner.pipeline_device_join import device_join
from hetpart.partitioner.pipeline_idle import ShapeFacts, format_ns, idle_reasons, kind_names, learn
from hetpart.partitioner.pipeline_join import JoinPlanner, join_probe
from hetpart.partitioner.pipeline_layers import layer_problem
from hetpart.partitioner.pipeline_outer import (
    Candidate, candidate, greedy_outer, kinds_of, one_machine_mixes, patterns_per_kind, realize, solve_outer,
    sync_estimates,
)
from hetpart.partitioner.pipeline_refine import refine_answer
from hetpart.partitioner.pipeline_shape import (
    ShapeSolve, _most_gpipe, _slow_first, _solve_shape, _solve_shape_why, doubled_shape, gpipe_share, stash_need_bytes,
    stash_ordered,
)
from hetpart.partitioner.pipeline_stripes import stripe_probe
from hetpart.partitioner.pipelines import PipelinesPlan, cost_pipelines, pipelines_violations
from hetpart.partitioner.problem import MEM_BYTES, Problem
from hetpart.partitioner.shape_memo import (
    ShapeMemo, memo_codec, record_search, record_stripes, seed_candidates, stripe_seeds,
)
from hetpart.partitioner.solve import SolveOptions

# NOTE [pipeline shapes]
# A machine kind is the multiset of (type, capacity) of a machine's devices with its
# intra-node link: two machines of one kind are interchangeable. A shape is either whole
# machines (a count per kind, at least one machine) or a piece of one machine (a count per
# device class of one kind, less than the whole machine). Mapping a shape's canonical
# devices to real ones machine by machine, class by class, changes no cost (same types,
# capacities and links, same machine boundaries), so each shape is solved once. Pieces of
# several pipelines may share a machine (patterns, NOTE [outer program]); a pipeline of whole
# machines plus part of another is not a shape (the bound still covers such plans, so the gap
# shows what that leaves out). Shapes tried: every memory-feasible piece, every mix of up to _FEW
# whole machines that holds the model, and every count vector of whole machines that holds the
# model with about one machine (or _SLACK) more than it needs --
# under 1F1B what it needs is estimated with the stash (`stash_need_bytes`: stage k of S keeps
# S - k microbatches, which on llama-70b doubles the memory a 24-stage pipeline needs; shapes
# within _LOOSE of the estimate are tried, the DP says which fit);
# longer ones at doubling sizes and all machines; ranked by
# NOTE [pipelines bound]'s rate and fill of their support, and solved in that order (kinds taken
# in turn; NOTE [doubled GPipe shapes] next where one says so) until the search's share of the time limit is spent.

_MAX_SHAPES = 400  # shapes enumerated at most (ranked; the rest are not tried)
_ROOMY = 1.0  # shapes with less memory than this times `stash_need_bytes` are solved after the others
_SLACK = 1.3  # NOTE [pipeline shapes]: how much more memory than the model a short shape may have
_LOOSE = 0.85  # ... and how much less than the stash estimate (the DP decides: 0.9 of it fitted on llama-70b)
_FEW = 3  # every mix of up to this many machines that holds the model is a shape
_EVERYTHING_FIRST = 128  # devices up to which the one-pipeline shape is solved first
# A shape's solve gets at most this share of the limit (or _SHAPE_LIMIT_S): the DP finds the same plan
# of 24 devices and 800 nodes in 1 s as in 5 s, and the outer program wants many shapes.
_SHAPE_SHARE = 0.02
_SHAPE_LIMIT_S = 1.0
# ... or this many seconds per devices^1.5, when more: the DP needs 12 s to find any plan of 88
# devices and 1,262 nodes that fits (none in 1.2 s), 0.7 s for 24 devices and 800 nodes.
_SHAPE_S_PER_DEVICE = 0.012
_CALIBRATE_DEVICES = 32  # the first shape solved has at most this many devices (when one has)
_MAX_PATTERNS = 2_000  # piece patterns per machine kind at most


@dataclass(frozen=True)
class MachineKind:
    """Machines with the same devices and link (NOTE [pipeline shapes])."""

    name: str
    classes: tuple[tuple[str, int], ...]  # (type, capacity) per device class
    counts: tuple[int, ...]  # devices per class on one machine
    machines: tuple[str, ...]  # the machines of this kind, sorted


@dataclass(frozen=True)
class Shape:
    """Whole machines per kind, or a piece (devices per class) of one machine of `piece_kind`."""

    machines: tuple[int, ...] = ()  # per kind, in kind order; () for a piece
    piece_kind: int = -1
    piece: tuple[int, ...] = ()


def _solve_growth(devices: int) -> float:
    """How a shape's solve time grows with its devices: as devices^1.5 (0.7 s on 24, 22 s on 256)."""
    return devices ** 1.5


def machine_kinds(problem: Problem) -> tuple[list[MachineKind], dict[str, int]]:
    """The kinds and each machine's kind index."""
    per = {m: problem.device_kinds(m) for m in dict.fromkeys(d.node for d in problem.devices)}
    groups: dict[tuple, list[str]] = {}
    for m, c in per.items():
        link = problem.intra_node_links.get(m)
        groups.setdefault((tuple(sorted(c.items())), link), []).append(m)
    kinds, of = [], {}
    for i, ((classes, _), ms) in enumerate(sorted(groups.items(), key=lambda kv: sorted(kv[1])[0])):
        kinds.append(MachineKind(f"k{i}", tuple(c for c, _ in classes), tuple(n for _, n in classes),
                                 tuple(sorted(ms))))
        of.update({m: i for m in ms})
    return kinds, of


def _class_devices(problem: Problem, kind: MachineKind, machine: str) -> list[list[str]]:
    """The machine's devices per class of its kind, in problem order."""
    out: list[list[str]] = [[] for _ in kind.classes]
    for d in problem.devices:
        if d.node == machine:
            out[kind.classes.index((d.type, d.capacity_bytes))].append(d.name)
    return out


def shape_devices(problem: Problem, kinds: list[MachineKind], shape: Shape,
                  machines: dict[int, list[str]] | None = None) -> tuple[str, ...]:
    """The shape's devices on `machines` (kind -> machine names to use; default the first of each kind)."""
    out: list[str] = []
    if shape.piece_kind >= 0:
        k = kinds[shape.piece_kind]
        m = (machines or {}).get(shape.piece_kind, [k.machines[0]])[0]
        for devs, n in zip(_class_devices(problem, k, m), shape.piece):
            out += devs[:n]
        return tuple(out)
    for i, n in enumerate(shape.machines):
        for m in (machines or {}).get(i, list(kinds[i].machines))[:n]:
            out += [d for devs in _class_devices(problem, kinds[i], m) for d in devs]
    return tuple(out)


def _capacity(kind: MachineKind, per_class: tuple[int, ...]) -> int:
    return sum(cap * n for (_, cap), n in zip(kind.classes, per_class))


def enumerate_shapes(problem: Problem, kinds: list[MachineKind]) -> list[Shape]:
    """NOTE [pipeline shapes]: the memory-feasible pieces and whole-machine vectors."""
    need = need_bytes(problem)
    shapes: list[Shape] = []
    for i, k in enumerate(kinds):
        for piece in itertools.product(*(range(n + 1) for n in k.counts)):
            if 0 < sum(piece) < sum(k.counts) and _capacity(k, piece) >= need:
                shapes.append(Shape(piece_kind=i, piece=piece))
    full = [_capacity(k, k.counts) for k in kinds]
    most = [len(k.machines) for k in kinds]
    per_machine = [sum(k.counts) for k in kinds]
    act = sum(problem.graph.nodes[v].get(MEM_BYTES, 0) for v in problem.graph.nodes)
    usable = sum(len(k.machines) * sum(k.counts) for k in kinds)
    want = lambda vec: stash_need_bytes(problem, need, act, sum(n * d for n, d in zip(vec, per_machine)),  # noqa: E731
                                        usable)
    # The most machines one kind needs alone, plus one, bounds how many machines a vector has.
    alone = [next((c for c in range(1, n + 1) if c * cap >= want([c if i == j else 0 for i in range(len(most))])),
                  None) for j, (cap, n) in enumerate(zip(full, most))]
    alone = [c for c in alone if c is not None]
    longest = min(sum(most), math.ceil((max(alone) if alone else sum(most)) * _SLACK) + 1)
    found: list[Shape] = []
    # Every mix of up to _FEW machines that holds the model (NOTE [pipeline shapes]): the rule below keeps
    # only shapes with about one machine more than they need, which on llama-7b left out every mix of
    # three 40-80 GB machines (the 24-GPU one of A100-80G, H100 and A100-40G takes 704 ms at 32
    # microbatches against the 16-GPU mixes' 766).
    for vec in _vectors(most, min(_FEW, sum(most))):
        if sum(c * n for c, n in zip(full, vec)) >= _LOOSE * want(vec):
            found.append(Shape(machines=vec))
    for vec in _vectors(most, longest):
        if Shape(machines=vec) in found:
            continue
        caps = sorted(full[j] for j in range(len(vec)) for _ in range(vec[j]))
        # Memory-feasible (NOTE [pipeline shapes]: the stash estimate), with about one machine more than
        # it needs: without its two smallest, less than _SLACK times that (whole ops want some room).
        if sum(caps) >= _LOOSE * want(vec) and (len(caps) <= 2 or sum(caps[2:]) < _SLACK * want(vec)):
            found.append(Shape(machines=vec))
            if len(found) >= _MAX_SHAPES:
                break
    # Longer pipelines (less gradient sync per device, the same bubble when the batch grows with the
    # cluster): one kind alone or all kinds in proportion, at doubling machine counts, and all machines.
    longer = {tuple(most)}
    for t in itertools.takewhile(lambda t: t < sum(most), (longest * 2**i for i in range(1, 30))):
        longer.add(tuple(round(t * n / sum(most)) for n in most))
        for j, n in enumerate(most):
            if t <= n:
                longer.add(tuple(t if i == j else 0 for i in range(len(most))))
    for vec in sorted(longer, key=lambda v: (sum(v), v)):
        cap = sum(c * n for c, n in zip(full, vec))
        if sum(vec) > longest and cap >= min(need, _LOOSE * want(vec)) and Shape(machines=vec) not in found:
            found.append(Shape(machines=vec))
    return shapes + found


def _vectors(most: list[int], longest: int):
    """Every vector of machine counts (each at most `most[j]`) with 1..longest machines, fewest first."""
    for total in range(1, longest + 1):
        for vec in itertools.product(*(range(min(n, total) + 1) for n in most)):
            if sum(vec) == total:
                yield tuple(vec)


def _support_rate(problem: Problem, devices: tuple[str, ...], supports) -> tuple[float, float]:
    """(fill ns, bottleneck ns) NOTE [pipelines bound] gives a pipeline on `devices`: the ranking's measure."""
    types = tuple(sorted({problem.device(d).type for d in devices}))
    a = next((s for s in supports if s.types == types), None)
    if a is None:
        return math.inf, math.inf
    lam_n = sum(a.lam.get(problem.device(d).type, 0.0) for d in devices)
    return a.fill_ns, max(a.largest_op_ns, a.work / lam_n if lam_n > 0 else math.inf)


# NOTE [stash order]
# Under 1F1B stage k of S stashes S - k microbatches, so which device sits where matters: the DP
# over device classes charges every stage the largest stash (NOTE [candidate cuts] in dp.py), and
# the list-order DP takes prefixes of the devices in the problem's order -- on the presets the
# fastest machines first, whose memory then goes to the stash (each holds a layer or two). The
# one-pipeline LP of NOTE [pipelines memory bound] says at which stash level each kind of device
# is worth most (`PipelinesBound.stash_order`: kinds by their mean level there, the deepest
# first); each shape is also solved with its devices in that order (kinds the LP left out last),
# and the faster of the two plans kept. Llama-70b on hetero-64 (docs/benchmarks.md, "The bound
# after bound19"): 64 GPUs in the preset's order 11.7 s, A100-80G then H100 first 6.73 s. The
# whole machines nearest the LP's devices of each kind are a shape of their own, solved first
# (`_lp_shapes`, halved until at most _EVERYTHING_FIRST devices; NOTE [LP shapes first]): there the
# LP also uses the 16 A100-40G (mean stash level 29, under a layer each), and those 48 GPUs take
# 6.25-6.39 s (device order) where the shapes reached took 6.61 s. The LP's order is that of one pipeline of the whole
# batch; on hetero-256 (256 microbatches) it puts the A100-40G last, and the 48-GPU shape then
# leaves them idle (5,566 ms at 48 microbatches against 5,292 with them): a third order, the
# slowest kinds first and among them the most memory first (`_slow_first`), is tried too.


# NOTE [LP shapes first]
# The LP's shapes (`_lp_shapes`) are solved right after the small shape that times `solve`, before the
# one pipeline on every device, and each may take a third of the search's time left (the others a sixth):
# under load the search's share is spent early. Llama-70b on hetero-64 at --time-limit 45 (30 s for the
# search): the LP's 48 GPUs give 6.25 s when their three device orders get about 1.5 s each; before, the
# 64-GPU pipeline went first (2-4 s, 8.2-10 s iterations: the one-pipeline baseline's plan, which
# `plan_with_baselines` solves again beside the search) and left the 48 GPUs 0.6 s, which gave 8.12 s
# (docs/benchmarks.md, "search19").


def _lp_shapes(kinds: list[MachineKind], devices: dict[tuple[str, int], float], fits) -> list[Shape]:
    """NOTE [stash order]: whole machines of each kind, as many as the one-pipeline LP's devices of its classes
    fill (a class on several kinds of machine fills them in kind order), divided by 1, 2, 4, ... until `fits`,
    rounded to the nearest machine and down; the first three that fit."""
    left = dict(devices)
    machines = []
    for k in kinds:
        n = min(float(len(k.machines)), sum(left.get(c, 0.0) for c in k.classes) / sum(k.counts))
        for c, count in zip(k.classes, k.counts):
            left[c] = max(0.0, left.get(c, 0.0) - n * count)
        machines.append(n)
    out: list[Shape] = []
    f = 1
    while sum(machines) >= f and len(out) < 3:
        for shape in (Shape(machines=tuple(int(n / f + 0.5) for n in machines)),
                      Shape(machines=tuple(int(n / f + 1e-9) for n in machines))):
            if sum(shape.machines) and fits(shape) and shape not in out:
                out.append(shape)
        f *= 2
    return out[:3]


def _certified(iteration_ns: int, bound_ns: int, gap: float) -> tuple[int, str]:
    """(the bound, at most the plan's step, and the status it proves): OPTIMAL at the bound, WITHIN_GAP
    within a positive `gap` of it, FEASIBLE otherwise."""
    lower = min(bound_ns, iteration_ns)
    within = gap > 0 and iteration_ns - lower <= gap * iteration_ns
    return lower, "OPTIMAL" if lower >= iteration_ns else "WITHIN_GAP" if within else "FEASIBLE"


def plan_pipelines(problem: Problem, microbatches: int, options: SolveOptions | None = None,
                   memo: ShapeMemo | None = None, **overrides: object) -> PipelinesPlan:
    """The best data-parallel pipelines over disjoint devices found within `time_limit_s`, with
    NOTE [pipelines bound]'s bound over every plan (NOTE [pipeline shapes], NOTE [outer program]).

    `options`/`overrides` as `solve` takes them: the time limit covers the whole search (the
    bound, every shape's solve, the outer program); with `gap` > 0 a plan certified within it is
    "WITHIN_GAP" (the search does not stop early for it). `memo`: NOTE [shape memo]'s solved shapes to start
    from (ignored when another problem's), extended with this search's.
    Raises HetpartError when no shape holds the model or none was solved in time.
    """
    return _plan_and_facts(problem, microbatches, options, memo=memo, **overrides)[0]


def _check_microbatches(microbatches: int) -> None:
    if microbatches < 1:  # a bad option: raised before the search, never caught as the search's refusal
        raise HetpartError(f"partitioner: the batch needs at least 1 microbatch, got {microbatches}")


def _plan_and_facts(problem: Problem, microbatches: int, options: SolveOptions | None = None,
                    memo: ShapeMemo | None = None, **overrides: object) -> tuple[PipelinesPlan, ShapeFacts]:
    """`plan_pipelines`, and what it learnt about the machine kinds' shapes (NOTE [idle reasons])."""
    t0 = time.perf_counter()
    opts = dataclasses.replace(options or SolveOptions(), **overrides) if overrides else options or SolveOptions()
    _check_microbatches(microbatches)
    problem.validate()
    check_holds_model(problem)  # before the bound and the shapes: no time helps
    limit = opts.time_limit_s
    deadline = lambda share: t0 + share * limit  # noqa: E731
    # NOTE [bounds deadline]: the bound's share of the limit, and a tenth more for its memory part.
    bound = pipelines_lower_bound(problem, microbatches, deadline=deadline(0.15), memory_deadline=deadline(0.25))
    layers = layer_problem(problem) if opts.run_coarsening else None  # NOTE [shapes on layers]
    one_f1b = problem.training is not None and problem.training.schedule == "1f1b"
    # NOTE [stash order]: the LP's order, and the slowest kinds first (the biggest memory first among equals).
    ordered = [stash_ordered(problem, layers, order) for order in (bound.stash_order, _slow_first(problem))
               if order] if one_f1b else []
    kinds, kind_of = machine_kinds(problem)
    shapes = enumerate_shapes(problem, kinds)
    need, act = need_bytes(problem), sum(problem.graph.nodes[v].get(MEM_BYTES, 0) for v in problem.graph.nodes)
    if not shapes:  # the devices hold one copy (check_holds_model), but no shape holds it with its stash
        as_1f1b = (dataclasses.replace(problem, training=dataclasses.replace(problem.training, schedule="1f1b"))
                   if problem.training is not None else problem)
        raise no_shape_refusal(problem, need, act, stash_need_bytes(problem, need, act, len(problem.devices)),
                               stash_need_bytes(as_1f1b, need, act, len(problem.devices)))
    supports = _supports(problem)
    usable = sum(len(k.machines) * sum(k.counts) for k in kinds)
    ranked: dict[int, list[tuple[tuple[bool, float], Shape]]] = {}
    for s in shapes:
        devs = shape_devices(problem, kinds, s)
        fill, b = _support_rate(problem, devs, supports)
        share = max(1, microbatches * len(devs) // max(1, usable))
        # Microbatches per device per ns if every pipeline were like this one, its sync at its floor.
        sync = sync_floor_ns(problem, len(devs), max(2, usable // len(devs))) if len(devs) < usable else 0
        per_device = (share / (fill + (share - 1) * b + sync)) / len(devs) if math.isfinite(fill + b) else 0.0
        main = s.piece_kind if s.piece_kind >= 0 else max(range(len(kinds)), key=lambda j: s.machines[j])
        # Shapes with little memory to spare go last: per-stage memory (the 1F1B stash, whole ops) often
        # leaves them no plan (the 405B-shaped model's 72-GPU shapes, 4% over the model, have none).
        tight = sum(problem.device(d).capacity_bytes for d in devs) < _ROOMY * stash_need_bytes(
            problem, need, act, len(devs), usable)
        ranked.setdefault(main, []).append(((tight, -per_device), s))
    # Best first within each kind, the kinds in turn.
    queues = [[s for _, s in sorted(v, key=lambda e: (e[0], e[1].machines, e[1].piece))]
              for _, v in sorted(ranked.items())]
    order = [s for turn in itertools.zip_longest(*queues) for s in turn if s is not None]
    # The two shortest shapes of one kind's machines alone first: pipelines that need no other kind's
    # machines, so the outer program can run copies of every kind side by side (on llama-70b over
    # hetero-256 the H100-led mixes took every H100 machine and left the A100 ones idle).
    pure = [s for j in range(len(kinds)) for s in sorted(
        (s for s in order if s.piece_kind < 0 and kinds_of(s) == {j}), key=lambda s: s.machines[j])[:2]]
    order = pure + [s for s in order if s not in pure]
    # The first shape solved times `solve` for the others (seconds per devices^1.5): a small one.
    small = next((s for s in order if len(shape_devices(problem, kinds, s)) <= _CALIBRATE_DEVICES), None)
    if small is not None:
        order.remove(small)
        order.insert(0, small)
    # NOTE [stash order]: the whole machines nearest the one-pipeline LP's devices (or a half, a quarter, ...
    # of them, where it is more than _EVERYTHING_FIRST devices), right after it.
    def fits(v: Shape) -> bool:  # at most _EVERYTHING_FIRST devices, and memory for the model in all
        devs = shape_devices(problem, kinds, v)
        return len(devs) <= _EVERYTHING_FIRST and sum(problem.device(d).capacity_bytes for d in devs) >= need

    lp = _lp_shapes(kinds, bound.stash_devices, fits)
    shapes += [v for v in lp if v not in shapes]
    # One pipeline on every device right after them (NOTE [LP shapes first]), so the plan is never worse than
    # today's -- up to _EVERYTHING_FIRST devices: above, `solve` on all of them overruns its share of the limit
    # (31 s for a 4.4 s share on 1,024 devices, 30 s for 5 s on 256), and one pipeline is far behind anyway.
    everything = Shape(machines=tuple(len(k.machines) for k in kinds))
    first = lp + ([everything] if everything in order and everything not in lp
                  and len(problem.devices) <= _EVERYTHING_FIRST else [])
    order = order[:1] + [s for s in first if s not in order[:1]] + [s for s in order[1:] if s not in first]  # once each
    # --- Solve the shapes in turn (NOTE [pipeline shapes]) until the search's share is spent.
    def shape_limit(n: int) -> float:  # the seconds one shape of n devices may take (search, stripes, joins)
        return max(_SHAPE_LIMIT_S, limit * _SHAPE_SHARE, _SHAPE_S_PER_DEVICE * _solve_growth(n))

    def solve_shape(devs: tuple[str, ...], m: int, limit_s: float) -> ShapeSolve:  # in every device order
        return _solve_shape_why(problem, devs, m, opts, limit_s, layers, ordered)

    def m_ref_of(n: int) -> int:  # the microbatches a shape of n devices is solved for (1F1B: any m >= S runs)
        share = max(1, microbatches * n // max(1, usable))
        return min(microbatches, max(share, n)) if problem.training and problem.training.schedule == "1f1b" else (
            microbatches)

    no_plan: dict[Shape, str] = {}  # shapes with no plan, why (NOTE [shape misses]), for NOTE [join probe]
    # NOTE [shape memo]: the memo's plans as candidates, its shapes solved after the others (if time is left).
    codec = memo_codec(memo, problem, microbatches, kinds, _class_devices, Shape)
    cands: list[Candidate] = seed_candidates(memo, codec, order, lambda s: shape_devices(problem, kinds, s), m_ref_of,
                                             microbatches, no_plan, deadline(0.6)) if codec else []
    covered = set(no_plan) | {c.shape for c in cands}  # shapes solved, or known to have no plan
    order = [s for s in order if s not in covered] + [s for s in order if s in covered and s not in no_plan]
    from_memo = len(cands)
    no_plan_m: dict[Shape, int] = {}  # the microbatches each miss of this search was solved for
    tried = 0
    facts = ShapeFacts(kind_of_machine=kind_of, in_shape={j for s in shapes for j in kinds_of(s)},
                       kind_names=kind_names(kinds))
    slowest = 0.0  # the most seconds per devices^1.5 a shape's solve took so far

    def expect_s(n: int) -> float:  # the seconds a shape of n devices is expected to take, at the slowest pace
        return slowest * _solve_growth(n)

    timed_out = 0  # shapes whose solve ran out of its time without a plan
    search_end = deadline(0.6)
    pos = 0
    while pos < len(order):
        s, pos = order[pos], pos + 1
        left = search_end - time.perf_counter()
        if left <= 0:
            break
        devs = shape_devices(problem, kinds, s)
        if slowest and expect_s(len(devs)) > left:
            continue  # `solve` would likely overrun what is left (about devices^1.5: 0.7 s on 24, 22 s on 256)
        share = max(1, microbatches * len(devs) // max(1, usable))
        sched = problem.training.schedule if problem.training is not None else None
        if sched == "gpipe":  # NOTE [GPipe stash estimate]: no fewer than the batch over the most pipelines
            share = gpipe_share(problem, need, act, len(devs), usable)
        t_shape = time.perf_counter()
        # 1F1B: a plan of S stages runs any m >= S; GPipe: any m up to the m it was solved for (the stash).
        m_ref = m_ref_of(len(devs))
        # NOTE [LP shapes first]: the LP's shapes may take a third of what is left, the others a sixth at most.
        per_shape = min(left / (3 if s in lp else min(6, len(order) - tried)), shape_limit(len(devs)))
        solved = solve_shape(devs, m_ref, per_shape)
        plan = solved.plan
        if plan is None and sched == "gpipe" and share < microbatches:
            m_ref, plan = _most_gpipe(problem, devs, share, microbatches, opts, per_shape, layers, search_end)
        tried += 1
        covered.add(s)
        facts.tried |= kinds_of(s)
        for j in kinds_of(s):
            facts.tried_count[j] = facts.tried_count.get(j, 0) + 1
        slowest = max(slowest, (time.perf_counter() - t_shape) / _solve_growth(len(devs)))
        got = candidate(problem, s, devs, plan, m_ref, microbatches)
        if got is None:
            if plan is None and solved.timed_out:
                timed_out += 1
            elif plan is None:
                no_plan[s], no_plan_m[s] = solved.why, m_ref  # NOTE [shape misses]: a miss that is not the limit's
            continue
        cands.append(got)
        twice = doubled_shape(kinds, s, got.hi, microbatches)  # NOTE [doubled GPipe shapes]
        if twice is not None and twice not in covered:
            order = order[:pos] + [twice] + [v for v in order[pos:] if v != twice]
            shapes += [] if twice in shapes else [twice]
    if not cands and all(s in no_plan for s in shapes):  # NOTE [shape misses]: none timed out
        raise PipelinesRefused(
            f"partitioner: none of the {len(shapes)} pipeline shapes whose memory holds the model in total has a "
            f"plan{' cut at layer boundaries' if layers is not None else ''} whose every stage fits (weights, "
            "training state and the activations it stashes): add memory, or stash fewer microbatches", len(no_plan))
    if not cands:
        many = tried - len(no_plan_m) - timed_out  # plans whose 1F1B stages outnumber the batch's microbatches
        raise PipelinesRefused(
            f"partitioner: no pipeline shape was solved within {limit:g} s ({len(shapes)} shapes hold the model, "
            f"{tried} tried: {len(no_plan)} fit no plan in memory, {timed_out} ran out of the time each was given, "
            f"{many} have plans of more stages than the {microbatches} microbatches 1F1B needs): " + " or ".join(
                (["raise --time-limit"] if timed_out or not covered >= set(shapes) else [])
                + (["more microbatches"] if many else [])), len(no_plan))
    # --- The outer program (NOTE [outer program]).
    pieces = {j: max((p for p in patterns_per_kind(kinds, cands).get(j, [])), default=0) for j in range(len(kinds))}
    kmax = max(1, min(microbatches, sum(len(k.machines) * max(1, pieces.get(j, 0)) for j, k in enumerate(kinds))))
    sync_estimates(problem, cands, kmax)
    unit = max(1, bound.bound_ns // 10_000)
    quick = greedy_outer(kinds, cands, microbatches, kmax)
    try:
        answer = solve_outer(kinds, cands, microbatches, kmax, max(1.0, deadline(0.95) - time.perf_counter()),
                             seed=opts.seed, workers=opts.workers, unit_ns=unit, hint=quick)
    except HetpartError:  # proven: no mix runs the batch (the greedy answer would be one)
        if quick is None:
            raise
        answer = None
    tried_answers = [(a, cost_pipelines(problem, realize(problem, kinds, cands, a, shape_devices, _class_devices),
                                        solver_status="FEASIBLE")) for a in (answer, quick) if a is not None]
    if not tried_answers:
        raise HetpartError(f"partitioner: the outer program found no mix of the {len(cands)} solved pipeline shapes "
                           f"that runs {microbatches} microbatches within {limit:g} s: raise --time-limit")
    # CP-SAT's answer unless the quick one is truly better (CP-SAT ran out of time before reaching it).
    # NOTE [striped pipelines]: 1/f of each machine the plan runs on (or of every machine) per pipeline, f of them.
    first_answer, first_plan = min(tried_answers, key=lambda ab: ab[1].iteration_ns)
    stripes = stripe_probe(problem, first_plan, microbatches,
                           lambda devs, m, limit_s: solve_shape(devs, m, limit_s).plan, shape_limit, deadline(0.8),
                           need, seeds=stripe_seeds(memo, codec, microbatches))  # NOTE [shape memo]
    record_stripes(memo, codec, stripes.solved)
    # NOTE [op-level refinement]: the answer's shapes op by op in the time left, and the outer program again.
    solved = len(cands)
    on_ops = [(o[0], None) for o in ordered]  # each order within its share of the refinement's limit
    more = refine_answer(problem, kinds, cands, first_answer,
                         microbatches, kmax, lambda devs, m, limit_s: _solve_shape(
                             problem, devs, m, opts, limit_s / (1 + len(on_ops)), None, on_ops),
                         deadline(0.9), seed=opts.seed, workers=opts.workers, unit_ns=unit)
    tried_answers += [(a, cost_pipelines(problem, realize(problem, kinds, cands, a, shape_devices, _class_devices),
                                         solver_status="FEASIBLE")) for a in more]
    answer, best = min(tried_answers, key=lambda ab: ab[1].iteration_ns)
    exhausted, outer_step_ns = answer.optimal, answer.step_units * answer.unit_ns
    # NOTE [join probe]: one idle machine given to each copy of a pipeline, the batch split again; a joined shape
    # the search has not solved is solved by its planner, in each device order (NOTE [stash order]).
    planner = JoinPlanner(
        devices=lambda s: shape_devices(problem, kinds, s), orders=1 + len(ordered), no_plan=no_plan,
        solve=solve_shape, limit_s=shape_limit, expect_s=expect_s)  # as the shapes' loop skips
    probe = join_probe(problem, kinds, cands, answer, best, microbatches, planner, deadline(1.0),
                       shape_devices, _class_devices)
    answer, best = probe.answer, probe.plan
    learn(facts, problem, cands, probe)  # NOTE [idle reasons]
    record_search(memo, codec, cands, no_plan, no_plan_m)  # NOTE [shape memo]
    for pipes in one_machine_mixes(problem, kinds, cands, microbatches, _class_devices):
        mix = cost_pipelines(problem, pipes, solver_status="FEASIBLE")
        best = mix if mix.iteration_ns < best.iteration_ns else best
    best = stripes.plan if stripes.plan.iteration_ns < best.iteration_ns else best
    # NOTE [device join]: a few idle devices given to the slowest pipelines, in what is left of the limit.
    best, device_stats, facts.device_tries = device_join(
        problem, best, microbatches, lambda devs, m, limit_s: solve_shape(devs, m, limit_s / (1 + len(ordered))).plan,
        shape_limit, expect_s, deadline(1.0))
    violations = pipelines_violations(problem, best, microbatches)
    if violations:
        raise HetpartError("partitioner: internal error, the pipelines plan breaks its rules:\n  "
                           + "\n  ".join(violations))
    lower, status = _certified(best.iteration_ns, bound.bound_ns, opts.gap)
    stats = {"seconds": time.perf_counter() - t0, "bound_seconds": bound.seconds, "shapes": float(len(shapes)),
             "shapes_tried": float(tried), "shapes_solved": float(solved), "shapes_refined": float(len(cands) - solved),
             "outer_optimal": float(exhausted), "shapes_from_memo": float(from_memo),
             "outer_step_ns": float(outer_step_ns), "kmax": float(kmax),
             "layer_nodes": float(layers.layers if layers is not None else 0),  # NOTE [shapes on layers]
             **probe.stats, **stripes.stats, **device_stats}  # NOTE [join probe], [striped pipelines], [device join]
    note = bound.note + ("" if exhausted else "; the outer program did not finish: a better mix of these shapes "
                         "may exist") + ("" if covered >= set(shapes) else f"; {len(set(shapes) - covered)} of "
                                         f"{len(shapes)} shapes not tried (time limit)")
    out = dataclasses.replace(best, lower_bound_ns=lower, solver_status=status, bound_note=note, stats=stats,
                              bound_unfinished=tuple(bound.unfinished))
    out.devices_idle = idle_reasons(problem, out, microbatches, facts)
    return out, facts


# NOTE [baselines as candidates]
# The baselines printed beside a `--parallel data` plan (NOTE [pipeline baselines]) are plans of the same
# space, costed by the same `cost_pipelines` and checked by `pipelines_violations`; when one is faster
# than the search's answer (the search ran out of time on big shapes: the 405B-shaped rows of
# docs/benchmarks.md), or when the search found none in time, it is the plan, as `solve` keeps the best
# of its candidates. The search's bound holds for every plan of the space, so it stays the bound (computed
# on its own when the search failed), and the status is recomputed against it.
def plan_with_baselines(problem: Problem, microbatches: int, options: SolveOptions | None = None, *,
                        baseline_limit_s: float, single_up_to: int = 128,
                        memo: ShapeMemo | None = None) -> tuple[PipelinesPlan, list]:
    """`plan_pipelines`' answer, or the fastest baseline when it beats it (NOTE [baselines as candidates]),
    and the baselines (`pipeline_baselines`, within `baseline_limit_s`; the one-pipeline baseline only up to
    `single_up_to` devices, where `solve` on all of them keeps its limit); `memo`: `plan_pipelines`'."""
    from hetpart.partitioner.pipeline_baselines import pipeline_baselines

    opts = options or SolveOptions()
    _check_microbatches(microbatches)  # (the baselines would run on it: a ZeroDivisionError in their split)
    try:
        plan, facts = _plan_and_facts(problem, microbatches, opts, memo=memo)
        failed, refused, own_1f1b = "", 0, None
    except HetpartError as e:  # no shape solved in time: a baseline may still have a plan
        plan, facts, failed = None, None, str(e).splitlines()[0]
        refused = e.memory_refused if isinstance(e, PipelinesRefused) else 0  # NOTE [tensor-parallel hint]
        own_1f1b = e.without_1f1b if isinstance(e, PipelinesRefused) else None  # NOTE [no shape holds the stash]
    baselines = pipeline_baselines(problem, microbatches, time_limit_s=baseline_limit_s, options=opts,
                                   single=len(problem.devices) <= single_up_to)
    valid = [b for b in baselines if b.plan is not None
             and (b.checked or not pipelines_violations(problem, b.plan, microbatches))]
    best = min(valid, key=lambda b: b.plan.iteration_ns, default=None)
    if plan is None and best is None:
        hint = _one_f1b_hint(problem, microbatches, opts)
        if hint and own_1f1b:  # the 1F1B advice once (NOTE [no shape holds the stash])
            failed = own_1f1b.splitlines()[0]
        raise PipelinesRefused(f"{failed}; and none of the baselines ({', '.join(b.name for b in baselines)}) has a "
                               "plan" + hint, refused)
    if plan is not None and (best is None or best.plan.iteration_ns >= plan.iteration_ns):
        return plan, baselines
    if plan is None:  # the bound holds for every plan: compute it on its own
        bound = pipelines_lower_bound(problem, microbatches, deadline=time.perf_counter() + 0.15 * opts.time_limit_s)
        search_bound, stats, unfinished = bound.bound_ns, {}, tuple(bound.unfinished)
        why = f"{bound.note}; the plan is the {best.name} baseline's: the search found none ({failed})"
    else:
        search_bound, stats, unfinished = plan.lower_bound_ns, dict(plan.stats), plan.bound_unfinished
        why = (f"{plan.bound_note}; the plan is the {best.name} baseline's, faster than the search's "
               f"{format_ns(plan.iteration_ns)}")
    lower, status = _certified(best.plan.iteration_ns, search_bound, opts.gap)
    taken = dataclasses.replace(best.plan, lower_bound_ns=lower, solver_status=status,
                                stats={**stats, f"plan_from_{best.name}": 1.0}, bound_unfinished=unfinished,
                                bound_note=f"{why} (NOTE [baselines as candidates])")
    taken.devices_idle = idle_reasons(problem, taken, microbatches, facts)
    return taken, baselines


def _one_f1b_hint(problem: Problem, microbatches: int, opts: SolveOptions) -> str:
    """Under GPipe, what to say when 1F1B would fit: every stage of a GPipe pipeline stashes all its
    microbatches, a 1F1B stage at most as many as the stages from it to the end (NOTE [training memory]).
    Tried on every device in one pipeline (NOTE [shapes on layers]), within a tenth of the time limit."""
    t = problem.training
    if t is None or t.schedule != "gpipe":
        return ""
    one_f1b = dataclasses.replace(problem, training=dataclasses.replace(t, schedule="1f1b"))
    devices = tuple(d.name for d in problem.devices)
    layers = layer_problem(one_f1b) if opts.run_coarsening else None
    plan = _solve_shape(one_f1b, devices, microbatches, opts, max(1.0, 0.1 * opts.time_limit_s), layers)
    if plan is None:
        return ""
    return (f". GPipe keeps all {microbatches} microbatches' activations on every stage; with --schedule 1f1b "
            f"(a stage keeps at most as many as the stages from it on) a plan of {len(plan.stages)} stages fits: "
            "pass --schedule 1f1b")
