"""The `--parallel data` search's solved shapes, kept for `hetpart replan` to start from (issue 21).

Nothing here imports torch. `partition` writes the memo to ir/shapes.json (codegen/pipelines_record.py, hashed
by the manifest with the rest of ir/); `hetpart replan` and benchmarks/spot_trace.py pass it to the search.

NOTE [shape memo]
What costs a `--parallel data` search its time is solving each pipeline shape (NOTE [pipeline shapes]) with
the exact planner, and that solve depends on the problem (the analysed graph, its times per device type,
memory, weights, training state, schedule, microbatch size, the network) and on the shape's devices (their
types, capacities, machines and the machines' links), not on how many machines of each kind the cluster
has. So a shape solved for one cluster is solved for every cluster with at least as many machines of its
kinds. The memo records, per shape named by its machine kinds' contents (`kind_key`: the device classes,
their counts per machine and the machine's link, never a machine's name or index): the plans the search
made of it (cuts as stage per node in graph order, each stage's device as a position in the shape: kind,
machine, device class, index, and the stage costs `evaluate` gave it), and the shapes whose solve proved no
plan fits (NOTE [shape misses]: not those that only ran out of time), with the microbatches each was solved
for. A memo is tied to its problem by `problem_fingerprint` (a hash of everything but the devices and each
machine's link); the search ignores a memo of another fingerprint (the model, its costs or the schedule
changed: `ignored`) and records its own shapes in it instead, so a stale memo never feeds a plan. In the
search (`seed_candidates`) each memo plan that maps onto the cluster's machines becomes a candidate before
any shape is solved, with its recorded costs where its memory is that of the solve it records (the same
microbatches, or, under 1F1B, both at least the shape's device count: a stage's stash is then S - k either
way; the same types, capacities and links give the same times; GPipe: at the microbatches it was solved for,
the most its stash allows), else evaluated and checked by `plan_violations` again; its shape is solved again only after every shape the memo
lacks, so a short re-plan spends its time on shapes it has not seen. A no-plan entry is taken under the
same condition. Evaluating each plan again cost 0.03 s (and its check 0.045 s) on llama-70b, as much as a
re-plan's search has for several shapes. Nothing else changes: the bound is computed as before, the outer
program, refinement, join probe and stripes run on the candidates, and the answer is re-costed on its real
devices (`realize`) and checked (`pipelines_violations`) as any plan of the search, so a memo can steer the
choice but not make a printed step or a certificate false (ir/shapes.json is hashed by the manifest as
ir/analysis.json is, whose costs the re-plan takes as they are).
Striped pipelines (NOTE [striped pipelines]) are kept the same way in `stripes`: stripe 0's plan, keyed by its
machines' kinds and the stripe count (`ShapeCodec.stripe_key`), its devices as positions among those machines;
on a cluster with at least as many machines of those kinds it maps onto the first machines of each kind
(`stripe_seeds`), and the stripe probe and the re-plan's stripe candidates (NOTE [re-plan pipelines] c) take it
before they solve, costing and checking the whole striped plan as their own.
docs/benchmarks.md ("spot21c", "spot21d") measures what it gives a 2 s re-plan on the trace.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import weakref
from dataclasses import dataclass, field

import networkx as nx

from hetpart.errors import HetpartError
from hetpart.partitioner.problem import Plan, Problem
from hetpart.partitioner.problem_json import problem_to_json

SHAPES_VERSION = 1
_PLANS_PER_SHAPE = 2  # NOTE [shape memo]: the fastest plans kept per shape (a solve and its refinement)
_SEEDS_AT_LEAST = 8  # memo plans a search takes whatever its time (each about 5 ms on llama-70b)


# The graph's part of a fingerprint, per graph object: 0.24 s on llama-70b's 3,690 nodes, which a 2 s re-plan
# would pay at every event; a re-plan's problem shares the stored problem's graph (`retarget`), and a Problem's
# graph is not changed once lowered (coarsening and sub-problems build new graphs).
_GRAPH_SHA: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _sha(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def problem_fingerprint(problem: Problem, microbatches: int) -> str:
    """NOTE [shape memo]: sha256 of the problem without its devices and machine links, and the batch's microbatches."""
    data = problem_to_json(dataclasses.replace(problem, graph=nx.DiGraph(), devices=[], intra_node_links={}))
    if data.get("tp_sync") is None:  # a key added after memos were written: absent, their problems are these
        data.pop("tp_sync", None)
    graph = _GRAPH_SHA.get(problem.graph)
    if graph is None:
        graph = _GRAPH_SHA[problem.graph] = _sha(problem_to_json(dataclasses.replace(
            problem, devices=[], intra_node_links={}))["graph"])
    return _sha({**data, "graph": graph, "microbatches": microbatches})


def kind_key(kind, link) -> str:
    """A machine kind by its contents (NOTE [shape memo]): classes (type, capacity), counts, link."""
    return json.dumps([[list(c) for c in kind.classes], list(kind.counts),
                       None if link is None else [link.bandwidth_bytes_per_us, link.latency_ns]])


@dataclass
class MemoPlan:
    """One memo plan: stage per node (graph order, run-length coded) and each stage's device position."""

    m_ref: int
    stages: list[list[int]]  # [[stage, run], ...] over the graph's nodes in order
    slots: list[list]  # per stage: [kind_key, machine ordinal, class index, index in class]
    time_ns: int  # its pipeline time at m_ref (which plans of a shape to keep)
    costs: list[list[int]]  # per stage: evaluate's compute_ns, comm_in_ns, comm_out_ns, memory_bytes at m_ref


@dataclass
class ShapeMemo:
    """NOTE [shape memo]: solved shapes of one problem (`fingerprint`), by `shape_key`."""

    fingerprint: str
    plans: dict[str, list[MemoPlan]] = field(default_factory=dict)
    no_plan: dict[str, tuple[int, str]] = field(default_factory=dict)  # shape key -> (m_ref, why)
    stripes: dict[str, list[MemoPlan]] = field(default_factory=dict)  # `stripe_key` -> stripe 0's plans
    seeded: int = 0  # plans the last search took from the memo (for the report)
    ignored: bool = False  # the last search was given another problem's memo, and emptied it

    def to_json(self) -> dict:
        return {"version": SHAPES_VERSION, "fingerprint": self.fingerprint,
                "plans": {k: [vars(p) for p in v] for k, v in sorted(self.plans.items())},
                "no_plan": {k: list(v) for k, v in sorted(self.no_plan.items())},
                "stripes": {k: [vars(p) for p in v] for k, v in sorted(self.stripes.items())}}

    @staticmethod
    def from_json(data: object, where: str) -> ShapeMemo:
        """The memo `to_json` wrote; an error naming `where` when it is not one."""
        try:
            if data.get("version") != SHAPES_VERSION:  # type: ignore[union-attr]
                raise HetpartError(f"{where}: version {data.get('version')}, this hetpart reads {SHAPES_VERSION}: "  # type: ignore[union-attr]
                                   "partition again to keep a memo of solved shapes")
            def plans(by_key: dict) -> dict[str, list[MemoPlan]]:
                return {str(k): [MemoPlan(int(p["m_ref"]), [[int(a), int(b)] for a, b in p["stages"]],
                                          [[str(s[0]), int(s[1]), int(s[2]), int(s[3])] for s in p["slots"]],
                                          int(p["time_ns"]), [[int(x) for x in c[:4]] for c in p["costs"]])
                                 for p in v] for k, v in by_key.items()}

            return ShapeMemo(str(data["fingerprint"]), plans(data["plans"]),  # type: ignore[index]
                             {str(k): (int(v[0]), str(v[1]))
                              for k, v in data["no_plan"].items()},  # type: ignore[index]
                             plans(data.get("stripes", {})))  # type: ignore[union-attr]  # none in older memos
        except HetpartError:
            raise
        except (AttributeError, KeyError, TypeError, ValueError, IndexError) as e:
            raise HetpartError(f"{where}: not a memo of solved shapes ({type(e).__name__}: {e}); partition again") from e


class ShapeCodec:
    """Shapes and plans of one cluster to and from memo keys and positions (NOTE [shape memo])."""

    def __init__(self, problem: Problem, kinds, class_devices, shape_type) -> None:
        self.problem, self.kinds, self.class_devices, self.shape_type = problem, kinds, class_devices, shape_type
        self.keys = [kind_key(k, problem.intra_node_links.get(k.machines[0])) for k in kinds]
        self.kind_of = {m: j for j, k in enumerate(kinds) for m in k.machines}
        self.order = list(problem.graph.nodes)

    def shape_key(self, shape) -> str:
        if shape.piece_kind >= 0:
            return json.dumps(["piece", self.keys[shape.piece_kind], list(shape.piece)])
        return json.dumps(["machines", sorted([self.keys[j], n] for j, n in enumerate(shape.machines) if n)])

    def shape_of(self, key: str):
        """The cluster's Shape of a memo key, or None when its machines are not all here."""
        data = json.loads(key)
        if data[0] == "piece":
            j = self.keys.index(data[1]) if data[1] in self.keys else -1
            return self.shape_type(piece_kind=j, piece=tuple(data[2])) if j >= 0 else None
        counts = [0] * len(self.kinds)
        for k, n in data[1]:
            if k not in self.keys or len(self.kinds[self.keys.index(k)].machines) < n:
                return None
            counts[self.keys.index(k)] = n
        return self.shape_type(machines=tuple(counts))

    def _positions(self, shape) -> dict[str, list]:
        """Each device of `shape`'s canonical devices -> its position."""
        out = {}
        if shape.piece_kind >= 0:
            kind_machines = [(shape.piece_kind, [self.kinds[shape.piece_kind].machines[0]])]
        else:
            kind_machines = [(j, list(self.kinds[j].machines[:n])) for j, n in enumerate(shape.machines) if n]
        for j, machines in kind_machines:
            for mo, m in enumerate(machines):
                for ci, devs in enumerate(self.class_devices(self.problem, self.kinds[j], m)):
                    for ix, d in enumerate(devs):
                        out[d] = [self.keys[j], mo, ci, ix]
        return out

    def stripe_key(self, machines: tuple[str, ...], stripes: int) -> str:
        """NOTE [striped pipelines] of `stripes` over `machines`, by the machines' kinds (NOTE [shape memo])."""
        counts: dict[str, int] = {}
        for m in machines:
            counts[self.keys[self.kind_of[m]]] = counts.get(self.keys[self.kind_of[m]], 0) + 1
        return json.dumps(["stripes", sorted([k, n] for k, n in counts.items()), stripes])

    def stripe_of(self, key: str) -> tuple[tuple[str, ...], int] | None:
        """(machines, stripes) of this cluster for a memo's stripe key (the first machines of each kind, as a
        shape takes them); None when it has too few machines of a kind."""
        data = json.loads(key)
        machines: list[str] = []
        for k, n in data[1]:
            if k not in self.keys or len(self.kinds[self.keys.index(k)].machines) < n:
                return None
            machines += self.kinds[self.keys.index(k)].machines[:n]
        return tuple(sorted(machines)), int(data[2])

    def stripe_positions(self, machines: tuple[str, ...], group: tuple[str, ...]) -> dict[str, list]:
        """Each device of `group` (a stripe of `machines`) -> its position: kind, machine ordinal among
        `machines` of that kind, device class, index in the class."""
        out, inside = {}, set(group)
        for m in machines:
            j = self.kind_of[m]
            mo = [u for u in machines if self.kind_of[u] == j].index(m)
            for ci, devs in enumerate(self.class_devices(self.problem, self.kinds[j], m)):
                out.update({d: [self.keys[j], mo, ci, ix] for ix, d in enumerate(devs) if d in inside})
        return out

    def encode(self, shape, plan: Plan, m_ref: int, time_ns: int,
               pos: dict[str, list] | None = None) -> MemoPlan | None:
        """The plan as a MemoPlan (`pos`: its devices' positions, default the shape's); None when a stage's slot
        is not one device of the shape (a TP slot)."""
        pos = self._positions(shape) if pos is None else pos
        if any(s not in pos for s in plan.slot_of_stage) or len(plan.stages) != len(plan.slot_of_stage):
            return None
        runs: list[list[int]] = []
        for v in self.order:
            k = plan.stage_of[v]
            if runs and runs[-1][0] == k:
                runs[-1][1] += 1
            else:
                runs.append([k, 1])
        return MemoPlan(m_ref, runs, [pos[s] for s in plan.slot_of_stage], time_ns,
                        [[st.compute_ns, st.comm_in_ns, st.comm_out_ns, st.memory_bytes] for st in plan.stages])

    def decode(self, shape, mp: MemoPlan,
               pos: dict[str, list] | None = None) -> tuple[dict[str, int], list[str]] | None:
        """(stage_of, device per stage) on this cluster (`pos` as `encode`'s); None when the memo plan does not fit
        the graph or shape."""
        if sum(n for _, n in mp.stages) != len(self.order) or len(mp.costs) != len(mp.slots):
            return None
        by_pos = {json.dumps(p): d for d, p in (self._positions(shape) if pos is None else pos).items()}
        devices = [by_pos.get(json.dumps(p)) for p in mp.slots]
        if None in devices or len(set(devices)) != len(devices):
            return None
        stage_of, i = {}, 0
        for k, n in mp.stages:
            for v in self.order[i:i + n]:
                stage_of[v] = k
            i += n
        return stage_of, devices  # type: ignore[return-value]

    def record(self, memo: ShapeMemo, shape, plan: Plan, m_ref: int, time_ns: int) -> None:
        """Keep `plan` of `shape` in the memo (the _PLANS_PER_SHAPE fastest per shape)."""
        mp = self.encode(shape, plan, m_ref, time_ns)
        if mp is None:
            return
        key = self.shape_key(shape)
        kept = [p for p in memo.plans.get(key, []) if (p.stages, p.slots) != (mp.stages, mp.slots)] + [mp]
        memo.plans[key] = sorted(kept, key=lambda p: p.time_ns)[:_PLANS_PER_SHAPE]
        memo.no_plan.pop(key, None)


def memo_codec(memo: ShapeMemo | None, problem: Problem, microbatches: int, kinds, class_devices,
               shape_type) -> ShapeCodec | None:
    """The search's codec when it has a memo; a memo of another problem (NOTE [shape memo]) is emptied first and
    then records this search's shapes (`ignored` says so)."""
    if memo is None:
        return None
    fingerprint = problem_fingerprint(problem, microbatches)
    if memo.fingerprint != fingerprint:
        memo.ignored = bool(memo.plans or memo.no_plan or memo.stripes)
        memo.fingerprint, memo.plans, memo.no_plan, memo.stripes = fingerprint, {}, {}, {}
    return ShapeCodec(problem, kinds, class_devices, shape_type)


def seed_candidates(memo: ShapeMemo, codec: ShapeCodec, order: list, devices_of, m_ref_of, microbatches: int,
                    no_plan: dict, end: float) -> list:
    """NOTE [shape memo]: the memo's plans that map onto this cluster as the search's candidates, the fastest per
    device first (its recorded microbatches per ns per device), the first _SEEDS_AT_LEAST whatever the time, the
    rest until `end` (perf_counter: a cut search's bound can take all of it); `no_plan` gets the memo's misses that
    hold for this search's shapes (`order`)."""
    from hetpart.partitioner.pipeline_outer import candidate
    from hetpart.partitioner.pipelines import sub_problem
    from hetpart.partitioner.replan_pipelines import pipeline_plan
    from hetpart.partitioner.verify import plan_violations

    schedule = problem.training.schedule if (problem := codec.problem).training is not None else None
    keyed = {codec.shape_key(s): s for s in order}
    shape_devices: dict = {}  # each shape's devices, found once (each call scans the cluster)

    def devices_of_shape(s) -> list[str]:
        if s not in shape_devices:
            shape_devices[s] = devices_of(s)
        return shape_devices[s]

    for key, (m, why) in memo.no_plan.items():
        s = keyed.get(key)
        if s is not None and no_plan_holds(m, m_ref_of(n := len(devices_of_shape(s))), n, schedule):
            no_plan[s] = why
    todo = []
    for key, plans in memo.plans.items():
        s = keyed.get(key) or codec.shape_of(key)
        if s is not None and s not in no_plan:
            n = len(devices_of_shape(s))
            todo += [(-mp.m_ref / max(1, mp.time_ns) / n, key, i, s, mp) for i, mp in enumerate(plans)]
    out = []
    for k, (_, _, _, s, mp) in enumerate(sorted(todo, key=lambda t: t[:3])):
        if k >= _SEEDS_AT_LEAST and time.perf_counter() > end:
            break
        got = codec.decode(s, mp)
        if got is None:
            continue
        devs = devices_of_shape(s)
        m = mp.m_ref if schedule == "gpipe" else m_ref_of(len(devs))  # GPipe: runs up to the m it was solved for
        if no_plan_holds(mp.m_ref, m, len(devs), schedule):  # the same memory: the costs recorded
            plan = pipeline_plan(problem, devs, got[0], got[1], m, mp.costs)
        else:  # 1F1B at fewer microbatches than devices: its stash may change, evaluate and check it again
            plan = pipeline_plan(problem, devs, got[0], got[1], m)
            if plan_violations(sub_problem(problem, devs, m), plan):
                continue
        c = candidate(problem, s, devs, plan, m, microbatches)
        if c is not None:
            out.append(c)
    memo.seeded = len(out)
    return out


def record_search(memo: ShapeMemo | None, codec: ShapeCodec | None, cands: list, no_plan: dict,
                  no_plan_m: dict) -> None:
    """Keep the search's candidates' plans and its own misses (`no_plan_m`: shape -> m) in the memo."""
    if memo is None or codec is None:
        return
    from hetpart.partitioner.pipelines import pipeline_time_ns

    for c in cands:
        codec.record(memo, c.shape, c.plan, c.m_ref, pipeline_time_ns(c.plan, c.m_ref))
    for s, m in no_plan_m.items():
        key = codec.shape_key(s)
        if key not in memo.plans:
            memo.no_plan[key] = (m, no_plan[s])


def stripe_seeds(memo: ShapeMemo | None, codec: ShapeCodec | None, microbatches: int) -> list:
    """NOTE [shape memo] for NOTE [striped pipelines]: each memo stripe whose machine kinds this cluster has, as
    (machines, stripes, stripe 0's plan at the microbatches the probe gives it), the most samples per ns of the
    whole striped plan first; the probe costs and checks each whole plan (`pipelines_violations`) as its own."""
    if memo is None or codec is None:
        return []
    from hetpart.partitioner.pipeline_stripes import stripe_devices, stripe_microbatches
    from hetpart.partitioner.replan_pipelines import pipeline_plan

    problem = codec.problem
    schedule = problem.training.schedule if problem.training is not None else None
    todo = []
    for key, plans in memo.stripes.items():
        got = codec.stripe_of(key)
        if got is not None and got[1] <= microbatches:
            todo += [(-got[1] * mp.m_ref / max(1, mp.time_ns), key, i, got, mp) for i, mp in enumerate(plans)]
    out = []
    for _, _, _, (machines, f), mp in sorted(todo, key=lambda t: t[:3]):
        group = stripe_devices(problem, machines, f)[0]
        got = codec.decode(None, mp, codec.stripe_positions(machines, group))
        if got is None:
            continue
        m = stripe_microbatches(problem, microbatches, f)
        same = no_plan_holds(mp.m_ref, m, len(group), schedule)  # the same stash: the costs recorded
        out.append((machines, f, pipeline_plan(problem, group, got[0], got[1], m, mp.costs if same else None)))
    return out


def record_stripes(memo: ShapeMemo | None, codec: ShapeCodec | None, solved: list) -> None:
    """Keep the stripe probe's solved stripes ((machines, stripes, stripe 0's devices, its plan, m) each)."""
    if memo is None or codec is None:
        return
    from hetpart.partitioner.pipelines import pipeline_time_ns

    for machines, f, group, plan, m in solved:
        mp = codec.encode(None, plan, m, pipeline_time_ns(plan, m), codec.stripe_positions(machines, group))
        if mp is None:
            continue
        key = codec.stripe_key(machines, f)
        kept = [p for p in memo.stripes.get(key, []) if (p.stages, p.slots) != (mp.stages, mp.slots)] + [mp]
        memo.stripes[key] = sorted(kept, key=lambda p: p.time_ns)[:_PLANS_PER_SHAPE]


def no_plan_holds(memo_m: int, m_ref: int, devices: int, schedule: str | None) -> bool:
    """NOTE [shape memo]: a memo's "no plan" at `memo_m` microbatches holds for a solve at `m_ref`."""
    return memo_m == m_ref or (schedule == "1f1b" and min(memo_m, m_ref) >= devices)


__all__ = ["MemoPlan", "ShapeCodec", "ShapeMemo", "SHAPES_VERSION", "memo_codec", "no_plan_holds", "problem_fingerprint",
           "record_search", "record_stripes", "seed_candidates", "stripe_seeds"]
