"""The certificates `hetpart partition --parallel data` prints, fuzzed end to end against brute force (planfuzz).

Used by test_plan_fuzz.py (seeded, a few problems) and benchmarks/plan_fuzz.py (by the hundred). Each problem is
one of `small_problem` (test_pipeline_search.py) or `random_pipelines_problem` (pipeline_bound_fuzz.py), small
enough for `brute_pipelines` (the exact optimum of every pipelines plan). The paths checked:

- `bound`: `pipelines_lower_bound` cut by its deadlines on a fake clock (every `time.perf_counter()` call in the
  bound's three modules is one tick; the deadlines a seeded number of ticks): what it returns is still at most the
  optimum, and when a deadline was met (`_past` said so, or an LP stopped) the report names the parts left out.
- `search`: `plan_with_baselines` (hence `plan_pipelines`) under a short or tiny real time limit and a gap: the
  printed step is `cost_pipelines` re-run on the plan, the plan breaks no rule (`pipelines_violations`), the
  printed bound is at most the optimum, OPTIMAL only at the optimum, WITHIN_GAP only within the gap of it, every
  idle device is unused and each "gives X (+Y%)" of NOTE [idle reasons] is the step of its join re-costed.
- `strategy`: `--strategy NAME`'s plan (`strategy_pipelines`): the same, with status BASELINE and no bound.
- `replan`: `hetpart replan`'s plan (`replan_pipelines_within`, then `PipelinesChoice.pipelines_for` as
  `compile_pipelines` writes it) after losing a device of the first plan: the same, on the cluster left.

`Tally` counts problems, false claims and the paths each run took (the deadline paths are read from the plan's
stats and the instrumented calls: bound cut, shapes left untried, outer program unfinished, join probe cut, a
baseline taken, the search failing).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import re
import time
import types
from collections import Counter
from dataclasses import dataclass, field

from hetpart.errors import HetpartError
from hetpart.partitioner import pipeline_bound_parts, pipeline_bounds, pipeline_join, pipeline_memory_bound
from hetpart.partitioner import pipeline_search
from hetpart.partitioner.pipeline_baselines import strategy_pipelines
from hetpart.partitioner.pipeline_bounds import need_bytes
from hetpart.partitioner.pipeline_idle import format_ns
from hetpart.partitioner.certificate import valid_plans
from hetpart.partitioner.pipelines import PipelinesPlan, cost_pipelines, pipelines_violations, sub_problem
from hetpart.partitioner.problem import OUT_BYTES, WEIGHTS, Problem
from hetpart.partitioner.replan_pipelines import OldPipeline
from hetpart.partitioner.shape_memo import ShapeMemo
from hetpart.partitioner.solve import SolveOptions

from pipeline_bound_fuzz import random_pipelines_problem
from test_pipeline_search import brute_pipelines, small_problem

CERTIFIED = ("OPTIMAL", "WITHIN_GAP", "FEASIBLE")


def fuzz_problem(seed: int) -> tuple[Problem, int, str]:
    """Problem `seed`, its microbatches, and which generator made it: `small_problem`, `random_pipelines_problem`,
    `wide_problem` or `tight_problem` (seeds 0, 1, 2, 3 mod 4)."""
    if seed % 4 == 0:
        p, M = small_problem(seed // 4)
        return p, M, "small"
    if seed % 4 == 1:
        p, M = random_pipelines_problem(10_000 + seed // 4)
        return p, M, "random"
    if seed % 4 == 2:
        return wide_problem(seed // 4) + ("wide",)
    return tight_problem(seed // 4) + ("tight",)


def tight_problem(seed: int) -> tuple[Problem, int]:
    """`small_problem` in inference with outputs of no bytes: NOTE [pipelines bound] then often reaches the
    optimum, so the search claims OPTIMAL (the claim checked against brute force)."""
    p, M = small_problem(30_000 + seed)
    g = p.graph.copy()
    for v in g.nodes:
        g.nodes[v][OUT_BYTES] = 0
    return dataclasses.replace(p, graph=g, training=None), random.Random(seed).choice([1, M])


def wide_problem(seed: int) -> tuple[Problem, int]:
    """`small_problem` with copies of its machines (same devices and link) up to 6 devices, and sometimes a machine
    of one device with little memory: interchangeable machines, so shapes of several machines of a kind, pieces of
    machines shared by pipelines, idle machines the join probe gives to pipelines, and devices idle for memory."""
    p, M = small_problem(20_000 + seed)
    rng = random.Random(seed)
    devices, links = list(p.devices), dict(p.intra_node_links)
    while True:
        m = rng.choice(sorted({d.node for d in p.devices}))
        mine = [d for d in p.devices if d.node == m]
        if len(devices) + len(mine) > 6:
            break
        copy = f"{m}c{len(links)}"
        devices += [dataclasses.replace(d, name=f"d{len(devices) + i}", node=copy) for i, d in enumerate(mine)]
        links[copy] = p.intra_node_links[m]
    if rng.random() < 0.4:  # a machine of one small device: idle for memory (a reason NOTE [idle reasons] proves)
        small = dataclasses.replace(p.devices[0], name=f"d{len(devices)}", node=f"small{len(links)}",
                                    capacity_bytes=int(need_bytes(p) * rng.choice([0.02, 0.3, 0.7])))
        devices.append(small)
        links[small.node] = p.intra_node_links[p.devices[0].node]
    return dataclasses.replace(p, devices=devices, intra_node_links=links), M + rng.choice([0, 2, 4])


def schedule_of(p: Problem) -> str:
    return p.training.schedule if p.training is not None else "inference"


@dataclass
class Tally:
    """Problems, false claims (each a line naming the seed), and how often each path was taken."""

    problems: int = 0
    no_plan: int = 0  # problems brute force finds no plan for
    unsound: list[str] = field(default_factory=list)
    paths: Counter = field(default_factory=Counter)  # path -> runs that took it
    bad_paths: Counter = field(default_factory=Counter)  # path -> runs that took it and made a false claim

    def add(self, seed: int, run: str, paths: set[str], problems: list[str]) -> None:
        """One run's paths, each counted as "RUN PATH" (the generator and schedule once, with the search)."""
        tags = {q for q in paths if q.startswith(("gen-", "schedule-"))}
        for q in {run} | {f"{run} {q}" for q in paths - tags} | (tags if run == "search" else set()):
            self.paths[q] += 1
            self.bad_paths[q] += bool(problems)
        self.unsound += [f"seed {seed} {run}: {x}" for x in problems]


# --- Instrumentation: what the bound and the search did, read back by the checks.

@contextlib.contextmanager
def recording():
    """Within it, `rec` holds: `bounds` (every PipelinesBound the search computed, with whether a deadline was met
    during it), `facts` (the search's ShapeFacts), `joins` (each JoinTry of the join probe with the pipelines it
    costed, as `.pipes`)."""
    rec = types.SimpleNamespace(bounds=[], facts=[], met=[False])
    saved = {}

    def patch(module, name, value):
        saved[(module, name)] = getattr(module, name)
        setattr(module, name, value)

    real_past = {m: m._past for m in (pipeline_bounds, pipeline_memory_bound)}
    for m, f in real_past.items():
        def past(deadline, f=f):
            got = f(deadline)
            rec.met[0] |= got
            return got
        patch(m, "_past", past)
    real_bound = pipeline_search.pipelines_lower_bound

    def bound(*a, **k):
        rec.met[0] = False
        got = real_bound(*a, **k)
        rec.bounds.append((got, rec.met[0]))
        return got
    patch(pipeline_search, "pipelines_lower_bound", bound)
    real_learn = pipeline_search.learn

    def learn(facts, *a, **k):
        rec.facts.append(facts)
        return real_learn(facts, *a, **k)
    patch(pipeline_search, "learn", learn)
    real_cost, real_try = pipeline_join.cost_pipelines, pipeline_join.JoinTry
    last = [None]

    def cost(problem, pipes, **k):
        last[0] = list(pipes)
        return real_cost(problem, pipes, **k)

    def join_try(*a, **k):
        t = real_try(*a, **k)
        t.pipes = last[0] if t.step_ns is not None else None
        return t
    patch(pipeline_join, "cost_pipelines", cost)
    patch(pipeline_join, "JoinTry", join_try)
    try:
        yield rec
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


@contextlib.contextmanager
def fake_clock():
    """`time.perf_counter()` in the bound's modules as a counter: one tick a call (deadlines in ticks)."""
    ticks = [0]

    def tick() -> float:
        ticks[0] += 1
        return float(ticks[0])

    fake = types.SimpleNamespace(perf_counter=tick)
    modules = (pipeline_bounds, pipeline_memory_bound, pipeline_bound_parts)
    saved = [m.time for m in modules]
    for m in modules:
        m.time = fake
    try:
        yield ticks
    finally:
        for m, t in zip(modules, saved):
            m.time = t


# --- The checks: each returns the false claims it found (empty: none).

def _left_out_said(bound, met: bool) -> list[str]:
    """A bound cut by its deadline says which parts it left out."""
    out = []
    if met and not bound.unfinished:
        out.append(f"a deadline was met but the bound reports nothing left out ({bound.note!r})")
    for part in bound.unfinished:
        words = {"pipelines": "did not finish", "sync": "gradient-sync floor (past the deadline)",
                 "memory": "memory-per-stage bound (past the deadline)",
                 "stage sums": "exact stage sums (past the deadline)",
                 "stage mix": "the stage mix (its closures past the deadline"}[part]
        if words not in bound.note:
            out.append(f"the bound left out {part} but its note does not say so ({bound.note!r})")
    return out


def check_bound_deadline(p: Problem, M: int, opt: int | None, rng: random.Random, draws: int = 3
                         ) -> tuple[list[str], set[str]]:
    """NOTE [pipelines bound] with deadlines a seeded number of fake-clock ticks away: `draws` pairs (deadline,
    memory deadline) drawn over the ticks the whole bound takes (the LP parts before the memory part starts, the
    memory part after), so each part of it is cut somewhere."""
    real_memory, real_parts = pipeline_bounds.memory_lower_bound, pipeline_bounds.parts_search
    starts, sync_starts = [], []
    with fake_clock() as ticks:
        def memory(*a, **k):  # the tick its memory part starts at
            starts.append(ticks[0])
            return real_memory(*a, **k)

        def parts(*a, **k):  # ... and the ticks its first search of the sync parts spans
            start = ticks[0]
            got = real_parts(*a, **k)
            sync_starts.append((start, ticks[0]))
            return got
        pipeline_bounds.memory_lower_bound, pipeline_bounds.parts_search = memory, parts
        try:
            full = pipeline_bounds.pipelines_lower_bound(p, M, deadline=1e9)  # (None: no ticks)
        finally:
            pipeline_bounds.memory_lower_bound, pipeline_bounds.parts_search = real_memory, real_parts
    total, mem_start = ticks[0], (starts or [ticks[0]])[0]
    sync_start, sync_end = (sync_starts or [(mem_start, mem_start)])[0]
    out = [] if opt is None or full.bound_ns <= opt else [f"bound {full.bound_ns} > optimum {opt} (no deadline)"]
    one = brute_one(p, M) if full.one_pipeline_ns > 0 else None
    paths: set[str] = set()
    for i in range(draws):
        # Half the draws cut the LP parts (and maybe the memory part after them), every other one of those in its
        # first search of the sync parts (a small share of its ticks: NOTE [stage sum cuts]'s lines take most),
        # half only the memory part.
        deadline = (rng.randint(1, mem_start) if i % 4 == 0 else rng.randint(sync_start, max(sync_start, sync_end))
                    if i % 2 == 0 else total + 2)
        memory_deadline = rng.randint(max(deadline, mem_start), total + 2)
        with recording() as rec, fake_clock():
            got = pipeline_bounds.pipelines_lower_bound(p, M, deadline=deadline, memory_deadline=memory_deadline)
        out += _left_out_said(got, rec.met[0])
        if opt is not None and got.bound_ns > opt:
            out.append(f"bound {got.bound_ns} > optimum {opt} (deadline {deadline}, memory {memory_deadline} of "
                       f"{total} ticks, left out {got.unfinished})")
        if one is not None and got.one_pipeline_ns > one:
            out.append(f"one-pipeline bound {got.one_pipeline_ns} > the one-pipeline optimum {one} (deadline "
                       f"{deadline}, memory {memory_deadline} of {total} ticks)")
        paths |= {f"bound-cut-{u}" for u in got.unfinished} | ({"bound-deadline-met"} if rec.met[0] else set())
    if one is not None and full.one_pipeline_ns > one:
        out.append(f"one-pipeline bound {full.one_pipeline_ns} > the one-pipeline optimum {one} (no deadline)")
    return out, paths


def brute_one(p: Problem, M: int) -> int | None:
    """The least step of a plan of one pipeline (any subset of the devices), brute force."""
    from test_pipeline_search import brute_groups
    import itertools

    names = [d.name for d in p.devices]
    best, cache = None, {}
    for r in range(1, len(names) + 1):
        for group in itertools.combinations(names, r):
            v = brute_groups(p, [group], M, cache)
            if v is not None:
                best = v if best is None else min(best, v)
    return best


def check_plan(p: Problem, M: int, plan: PipelinesPlan, opt: int | None, gap: float, statuses=CERTIFIED
               ) -> list[str]:
    """The claims every printed pipelines plan makes (see the module's docstring)."""
    out = []
    if opt is None:
        return [f"a plan of step {plan.iteration_ns} where brute force finds none"]
    bad = pipelines_violations(p, plan, M)
    out += [f"breaks a rule: {v}" for v in bad]
    again = cost_pipelines(p, plan.pipelines, solver_status="x")
    if (again.iteration_ns, again.grad_sync_ns) != (plan.iteration_ns, plan.grad_sync_ns):
        out.append(f"printed step {plan.iteration_ns} (sync {plan.grad_sync_ns}) is not its re-costing "
                   f"{again.iteration_ns} (sync {again.grad_sync_ns})")
    if plan.iteration_ns < opt:
        out.append(f"step {plan.iteration_ns} below the brute-force optimum {opt}")
    if plan.lower_bound_ns > opt:
        out.append(f"bound {plan.lower_bound_ns} > optimum {opt} ({plan.bound_note})")
    if plan.solver_status not in statuses:
        out.append(f"status {plan.solver_status}, expected one of {statuses}")
    if plan.solver_status == "OPTIMAL" and plan.iteration_ns != opt:
        out.append(f"OPTIMAL at {plan.iteration_ns}, the optimum is {opt}")
    if plan.solver_status == "WITHIN_GAP" and not (gap > 0 and plan.iteration_ns - opt <= gap * plan.iteration_ns):
        out.append(f"WITHIN_GAP {gap} at {plan.iteration_ns}, the optimum is {opt}")
    if statuses == CERTIFIED and plan.solver_status != "OPTIMAL" and plan.lower_bound_ns >= plan.iteration_ns:
        # (`_certified`'s statuses; a re-plan is written FEASIBLE whatever its bound: it claims nothing)
        out.append(f"status {plan.solver_status} though its bound {plan.lower_bound_ns} reaches its step")
    if plan.solver_status == "BASELINE" and plan.lower_bound_ns:
        out.append(f"a baseline's plan claims bound {plan.lower_bound_ns}")
    out += check_each_pipeline(p, plan)
    out += check_memory_reasons(p, M, plan)
    used = {d for q in plan.pipelines for s in q.plan.stages for d in (s.devices or (s.device,))}
    if set(plan.devices_idle) != {d.name for d in p.devices} - used:
        out.append(f"idle devices {sorted(plan.devices_idle)}, unused {sorted({d.name for d in p.devices} - used)}")
    return out


def check_each_pipeline(p: Problem, plan: PipelinesPlan) -> list[str]:
    """plan.json prints each pipeline's own bound and status: its plan's bound is at most the brute-force least
    value of its objective on its devices for its microbatches, and OPTIMAL only at that least value."""
    out = []
    for q in plan.pipelines:
        own = q.plan
        if own.lower_bound_ns <= 0 and own.solver_status not in ("OPTIMAL", "WITHIN_GAP"):
            continue
        if own.objective == "iteration" and own.microbatches != q.microbatches:
            out.append(f"pipeline {q.index}: its plan's bound is for {own.microbatches} microbatches, it runs "
                       f"{q.microbatches}")
            continue
        sub = sub_problem(p, q.devices, q.microbatches)
        values = [sum(st.time_ns for st in stages) + (q.microbatches - 1) * max(st.time_ns for st in stages)
                  if own.objective == "iteration" else max(st.time_ns for st in stages)
                  for _, _, stages in valid_plans(sub)]
        least = min(values, default=None)
        if least is None:
            out.append(f"pipeline {q.index}: a plan where brute force finds none on its devices")
            continue
        if own.lower_bound_ns > least:
            out.append(f"pipeline {q.index}: its bound {own.lower_bound_ns} > its least {own.objective} {least}")
        if own.solver_status == "OPTIMAL" and own.value_ns != least:
            out.append(f"pipeline {q.index}: OPTIMAL at {own.value_ns}, its least {own.objective} is {least}")
    return out


def check_memory_reasons(p: Problem, M: int, plan: PipelinesPlan) -> list[str]:
    """NOTE [idle reasons]' proofs about memory: a device that "holds no op", or that "no pipeline containing it can
    hold the model", is in no valid plan of any pipeline of any share of the batch (brute force over the device
    sets with it)."""
    import itertools

    out = []
    for d, why in plan.devices_idle.items():
        if not (why.startswith("memory: ") and ("holds no op" in why or "no pipeline containing it" in why)):
            continue
        others = [x.name for x in p.devices if x.name != d]
        found = next(((group, m) for r in range(len(others) + 1) for rest in itertools.combinations(others, r)
                      for group in [(d, *rest)] for m in range(1, M + 1)
                      if any(d in devs for _, devs, _ in valid_plans(sub_problem(p, group, m)))), None)
        if found is not None:
            out.append(f"{d}: {why!r}, but a plan of {found[0]} for {found[1]} microbatch(es) runs a stage on it")
    return out


_GIVES = re.compile(r"adding one (.+?) machine to pipelines? ([\d, ]+?)(?: gives | adds nothing: the joined devices' "
                    r"plan leaves it out \()([\d,.]+ (?:ms|us|ns)) \(([+-]?[\d.]+)%\)")


def check_join_numbers(p: Problem, M: int, plan: PipelinesPlan, rec, opt: int | None) -> tuple[list[str], int]:
    """NOTE [idle reasons]' "adding one K machine to pipeline i gives X (+Y%)": X and Y are the join's re-costed
    step against the plan's, the join is a valid plan, runs no faster than the optimum, and is no better than the
    plan (the probe would have taken it). (false claims, numbers checked)."""
    out, checked = [], 0
    facts = rec.facts[-1] if rec.facts else None
    for d, why in plan.devices_idle.items():
        m = _GIVES.search(why)
        if m is None:
            continue
        checked += 1
        if facts is None:
            out.append(f"{d}: a join quoted without a search ({why!r})")
            continue
        j = facts.kind_of_machine[p.device(d).node]
        t = facts.joins.get(j)
        if t is None or t.step_ns is None or getattr(t, "pipes", None) is None:
            out.append(f"{d}: a join quoted that the probe did not cost ({why!r})")
            continue
        joined = cost_pipelines(p, t.pipes, solver_status="x")
        if joined.iteration_ns != t.step_ns:
            out.append(f"{d}: the join's step {t.step_ns} is not its re-costing {joined.iteration_ns}")
        bad = pipelines_violations(p, joined, M)
        out += [f"{d}: the quoted join breaks a rule: {v}" for v in bad]
        if opt is not None and joined.iteration_ns < opt:
            out.append(f"{d}: the quoted join {joined.iteration_ns} is below the optimum {opt}")
        if m.group(3) != format_ns(joined.iteration_ns):
            out.append(f"{d}: quotes {m.group(3)}, the join re-costs to {format_ns(joined.iteration_ns)}")
        more = (joined.iteration_ns - plan.iteration_ns) / max(1, plan.iteration_ns)
        if f"{more:+.1%}" != f"{m.group(4)}%":
            out.append(f"{d}: quotes {m.group(4)}%, the join against the plan is {more:+.1%}")
        if joined.iteration_ns < plan.iteration_ns:
            out.append(f"{d}: a join faster than the plan ({joined.iteration_ns} < {plan.iteration_ns}) was not taken")
        kind_devices = {x.name for x in p.devices if facts.kind_of_machine[x.node] == j}
        on = lambda pp: sum(1 for q in pp.pipelines for x in q.devices if x in kind_devices)  # noqa: E731
        if on(joined) <= on(plan):
            out.append(f"{d}: the quoted join has no more devices of its kind than the plan")
        # Machines of a kind are interchangeable: a join adds a machine when its plan runs stages on more of the
        # kind's machines than the plan does (review19: one moved to another machine of its kind is no join).
        kind_machines = {x.node for x in p.devices if facts.kind_of_machine[x.node] == j}
        busy = lambda pp: len(kind_machines & {p.device(x).node for q in pp.pipelines  # noqa: E731
                                               for st in q.plan.stages for x in (st.devices or (st.device,))})
        if ("adds nothing" in m.group(0)) != (busy(joined) <= busy(plan)):
            out.append(f"{d}: says the join {'adds nothing' if 'adds nothing' in m.group(0) else 'runs'} on the "
                       f"added machine, its plan runs stages on {busy(joined)} machine(s) of the kind, the plan on "
                       f"{busy(plan)}")
        pipes = tuple(int(x) for x in m.group(2).split(","))
        if pipes != t.pipelines:
            out.append(f"{d}: quotes pipelines {pipes}, the join gave the machine to {t.pipelines}")
    return out, checked


def search_paths(plan: PipelinesPlan, rec) -> set[str]:
    """The deadline (and other) paths a search run took, from its stats and the instrumented calls."""
    s = plan.stats
    out = {f"status-{plan.solver_status}"}
    for b, met in rec.bounds:
        out |= {f"bound-cut-{u}" for u in b.unfinished} | ({"bound-deadline-met"} if met else set())
    if s.get("shapes_tried") is not None and s.get("shapes_tried", 0) < s.get("shapes", 0):
        out.add("shapes-left-untried")
    if "outer_optimal" in s and not s["outer_optimal"]:
        out.add("outer-unfinished")
    if "join_finished" in s and not s["join_finished"]:
        out.add("join-cut")
    if s.get("join_taken"):
        out.add("join-taken")
    if s.get("shapes_refined"):
        out.add("refined")
    if any(k.startswith("plan_from_") for k in s):
        out.add("baseline-taken")
    if "shapes" not in s:
        out.add("search-failed")
    if any(" gives " in w or "adds nothing" in w for w in plan.devices_idle.values()):
        out.add("join-quoted")
    return out


def run_search(p: Problem, M: int, opt: int | None, limit_s: float, gap: float, seed: int, memo=None
               ) -> tuple[list[str], set[str], PipelinesPlan | None]:
    """`plan_with_baselines` as `hetpart partition --parallel data` runs it (its solved shapes kept in `memo`, as
    ir/shapes.json keeps them: NOTE [shape memo]), and its claims checked."""
    opts = SolveOptions(time_limit_s=limit_s, gap=gap, seed=seed)
    with recording() as rec:
        try:
            plan, _ = pipeline_search.plan_with_baselines(p, M, opts, baseline_limit_s=max(0.5, limit_s / 2),
                                                          memo=memo)
        except HetpartError as e:
            if "internal error" in str(e):
                return [f"internal error: {str(e).splitlines()[0]}"], {"refused"}, None
            paths = {"refused"} | {f"bound-cut-{u}" for b, _ in rec.bounds for u in b.unfinished}
            # A refusal is a false claim only where it says no plan exists and brute force has one.
            said_none = "none of the" in str(e) and "fits" in str(e) and "raise --time-limit" not in str(e)
            return ([f"refused ({str(e).splitlines()[0]}) though brute force has a plan of {opt}"]
                    if opt is not None and said_none else []), paths, None
    out = check_plan(p, M, plan, opt, gap)
    for b, met in rec.bounds:
        out += _left_out_said(b, met)
        if b.unfinished and not any(w in plan.bound_note for w in ("past the deadline", "did not finish")):
            out.append(f"the search's bound left out {b.unfinished}, the plan's note does not say so")
    quoted, _ = check_join_numbers(p, M, plan, rec, opt)
    return out + quoted, search_paths(plan, rec), plan


def run_strategy(p: Problem, M: int, opt: int | None, name: str, limit_s: float) -> tuple[list[str], set[str]]:
    """`--parallel data --strategy NAME`'s plan and its claims."""
    try:
        plan, _ = strategy_pipelines(p, M, name, SolveOptions(time_limit_s=limit_s), time_limit_s=limit_s)
    except HetpartError:
        return [], {f"strategy-{name}-refused"}
    return check_plan(p, M, plan, opt, 0.0, statuses=("BASELINE",)), {f"strategy-{name}"}


def _old_of(plan: PipelinesPlan) -> list[OldPipeline]:
    return [OldPipeline(q.devices, dict(q.plan.stage_of), tuple(q.plan.slot_of_stage), q.microbatches)
            for q in plan.pipelines]


def _holders(p: Problem, plan: PipelinesPlan) -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for q in plan.pipelines:
        for v, k in q.plan.stage_of.items():
            for w in p.graph.nodes[v].get(WEIGHTS, ()):
                dev = q.plan.slot_of_stage[k]
                if dev not in out.setdefault(w, []):
                    out[w].append(dev)
    return {w: tuple(ds) for w, ds in out.items()}


def run_replan(p: Problem, M: int, plan: PipelinesPlan, rng: random.Random, limit_s: float, memo=None
               ) -> tuple[list[str], set[str]]:
    """`hetpart replan` after losing one device the plan uses, its search started from the first search's `memo`
    (NOTE [shape memo]): its written plan (`PipelinesChoice.pipelines_for`) checked against brute force on the
    devices left."""
    from hetpart.partitioner.replan_deadline import replan_pipelines_within
    from hetpart.replan import PipelinesChoice

    used = sorted({d for q in plan.pipelines for s in q.plan.stages for d in (s.devices or (s.device,))})
    if len(p.devices) < 2 or not used:
        return [], set()
    lost = rng.choice(used)
    left = dataclasses.replace(p, devices=[d for d in p.devices if d.name != lost])
    opt = brute_pipelines(left, M)
    try:
        result, _ = replan_pipelines_within(left, _old_of(plan), _holders(p, plan), M, slack=rng.choice([0.0, 0.05]),
                                            time_limit_s=limit_s, seed=0, memo=memo)
    except HetpartError:
        return [], {"replan-refused"}
    written = PipelinesChoice(stored=left, result=result, record={}).pipelines_for(left)
    out = check_plan(left, M, written, opt, 0.0, statuses=("FEASIBLE",))
    if result.scratch is not None:
        out += [f"replan's from-scratch plan: {x}" for x in check_plan(left, M, result.scratch.plan, opt, 0.0)]
    return out, {"replan", "replan-" + ("scratch" if result.scratch is not None else "resplits-only"),
                 *(["replan-from-memo"] if memo is not None and memo.seeded else []),
                 f"replan-chose-{result.chosen.how[0] if result.chosen.how else 'none'}"}


LIMITS = (0.002, 0.01, 0.03, 0.1, 0.3, 1.0)  # seconds: the tiny ones cut the bound and the search
GAPS = (0.0, 0.0, 0.02, 0.1, 0.3)


def fuzz_one(seed: int, tally: Tally, *, limits=LIMITS, strategies: bool = True, replan: bool = True) -> None:
    """Problem `seed` through every path of the module's docstring, its findings added to `tally`."""
    rng = random.Random(seed)
    p, M, gen = fuzz_problem(seed)
    opt = brute_pipelines(p, M)
    tally.problems += 1
    tally.no_plan += opt is None
    tag = {f"gen-{gen}", f"schedule-{schedule_of(p)}"}
    bad, paths = check_bound_deadline(p, M, opt, rng)
    tally.add(seed, "bound", paths | tag, bad)
    limit, gap = rng.choice(limits), rng.choice(GAPS)
    memo = ShapeMemo("")
    bad, paths, plan = run_search(p, M, opt, limit, gap, seed, memo)
    tally.add(seed, "search", paths | tag | {f"limit-{limit:g}"}, bad)
    if strategies:
        name = rng.choice(["megatron", "metis", "one-pipeline"])
        bad, paths = run_strategy(p, M, opt, name, max(0.5, limit))
        tally.add(seed, "strategy", paths | tag, bad)
    if replan and plan is not None:
        if not memo.plans:  # a search cut short kept no shape: a memo as a longer partition writes it
            with contextlib.suppress(HetpartError):
                pipeline_search.plan_pipelines(p, M, time_limit_s=1.0, memo=memo)
        bad, paths = run_replan(p, M, plan, rng, max(0.3, limit), memo)
        tally.add(seed, "replan", paths | tag, bad)


def timed(seeds, **kw) -> tuple[Tally, float]:
    t0 = time.perf_counter()
    tally = Tally()
    for s in seeds:
        fuzz_one(s, tally, **kw)
    return tally, time.perf_counter() - t0
