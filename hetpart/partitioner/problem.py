"""The partitioning problem as plain data, and the plan that answers it.

The partitioner never imports torch: it sees a DAG of integer costs, a set of
devices and the links between them. `hetpart.passes.lower` builds a `Problem`
from an annotated FX graph; codegen applies the `Plan` back to the graph.

Cost model (see NOTE [stage time] in `costs.py`): a plan is an ordered chain
of stages, each on its own device. A value produced in stage s and consumed in
stage t > s crosses every boundary s|s+1, ..., t-1|t and pays its bytes on each.
A boundary between stages k and k+1 takes `tensors * link.latency_ns + ceil(bytes * 1000 /
link.bandwidth_bytes_per_us)`, one latency per tensor crossing it; a stage's time is its compute
time on its device's type plus the transfer time of the boundaries on both of its sides.

    >>> import networkx as nx
    >>> g = nx.DiGraph()
    >>> g.add_node("x", time_ns={"gpu": 0}, mem_bytes=0, out_bytes=16, pin=PIN_FIRST)
    >>> g.add_node("out", time_ns={"gpu": 0}, mem_bytes=0, out_bytes=0, pin=PIN_LAST)
    >>> g.add_edge("x", "out")
    >>> p = Problem(graph=g, weights={}, devices=[Device("g0", "gpu", "n0", 1 << 30)],
    ...             intra_node_links={"n0": Link(300_000, 2_000)}, network=Link(12_500, 10_000))
    >>> p.link("g0", "g0").latency_ns
    2000
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import networkx as nx

from hetpart.errors import HetpartError
from hetpart.partitioner.tp_sync import TPSyncLayout

if TYPE_CHECKING:
    from hetpart.partitioner.bounds import Bounds
    from hetpart.partitioner.solve import SolveStats

# Node attributes read from `Problem.graph` (networkx style: functions name the attribute).
TIME_NS = "time_ns"  # dict[device type, int]: compute time of the node on that type
FORWARD_NS = "forward_ns"  # optional, training: the forward part of TIME_NS (NOTE [simulated ratios] in baselines.py)
MEM_BYTES = "mem_bytes"  # int: memory the node needs in its stage (activations, workspace)
OUT_BYTES = "out_bytes"  # int: bytes of the node's output, paid on every boundary it crosses
OUT_TENSORS = "out_tensors"  # optional int >= 1: the tensors that output is (a multi-output op's parts), each one
# message on every boundary it crosses, each paying the link's latency (default 1; NOTE [stage time] in costs.py)
WEIGHTS = "weights"  # tuple[str, ...]: names of the weights the node reads (see Problem.weights)
PIN = "pin"  # PIN_FIRST, PIN_LAST or None
LAYER = "layer"  # optional str: the model layer the node belongs to (e.g. "blocks.3"), for baselines
COLOCATE = "colocate"  # optional str: nodes with the same value must share a stage (tied weights, fwd + bwd)
FORBIDDEN_TYPES = "forbidden_types"  # optional tuple[str, ...]: device types that cannot run the node
MEM_BYTES_OF = "mem_bytes_of"  # optional dict[slot type, int]: MEM_BYTES on those types (NOTE [memory per slot type])

PIN_FIRST = "first"  # the node is in stage 0 (model inputs are fed to the first stage); NOTE [pins]
PIN_LAST = "last"  # the node is in the last stage (model outputs leave from the last stage); NOTE [pins]

# NOTE [pins]
# A plan honours three pin rules (verify.py checks them; cpsat.py, dp.py, the ideal DP, bounds.py and the
# brute force of certificate.py search and bound exactly these plans):
# 1. a PIN_FIRST node is in stage 0; 2. a PIN_LAST node is in the last stage;
# 3. every stage holds a node that is not pinned last: nodes pinned last never make a stage of their own.
# Rule 3 costs nothing on a lowered problem: lowering pins last only the FX output node, which is free
# (no time, memory, weights or output bytes). A last stage of free nodes only would run nothing and add a
# boundary; merging it into the stage before removes that boundary and adds no time or memory (a 1F1B
# stash only shrinks with fewer stages), so under every objective some plan keeping rule 3 is as good.
# It also bounds the stage count by the unpinned nodes (`cpsat._build`'s K). On a hand-built problem that
# pins a costly op last, rule 3 does forbid plans: in a -> b -> c with a first and c last, the plan
# a | b | c is invalid (its last stage holds only c), so the optimum may be a 2-stage plan slower than it
# (tests/partitioner/test_pins.py). To give such an op a stage of its own, leave it unpinned and pin last
# a free node that reads it. Pins need not be at the graph's ends: a PIN_FIRST node takes its ancestors
# into stage 0 and a PIN_LAST node its descendants into the last stage (one stage, when one precedes
# the other), and `node_order` puts pinned nodes as early or as late as the edges allow.


@dataclass(frozen=True)
class Device:
    """One device of the cluster, as the partitioner sees it."""

    name: str  # unique, e.g. "a/0"
    type: str  # device type, a key of every node's `time_ns`
    node: str  # the machine it sits in; devices on one machine share its intra-node link
    capacity_bytes: int


# NOTE [slots]
# A stage runs on a slot: the devices that run it, all of one type. Today every slot is of kind
# "device": one device, named as it is (`Problem.slots` makes one per device, in device order).
# The next kinds: "replicas" (a data-parallel set of same-type devices, each running the stage
# on a share of the microbatch) and "tensor-parallel" (a group inside one machine splitting each
# op). A plan names a slot per stage (`Plan.slot_of_stage`); the chosen slots' devices must be
# disjoint (verify.py; the CP-SAT model: "each device in at most one chosen slot").
# `Plan.device_of_stage` and `StageCost.device` read the slot's one device: valid while every slot
# is single-device, so code outside the partitioner (codegen, runtime, report) keeps working; a
# multi-device kind must give them a mesh instead (the manifest: stage -> ranks, process groups).
# Where a new kind plugs in: (1) the slot enumeration, `Problem.slots` (later devices/, with the
# kinds the cluster allows); (2) costs.py: its compute (`slot_compute_ns`), its memory
# (`slot_capacity_bytes`, and what `stage_memory_bytes` holds per device) and its collectives
# (a gradient all-reduce, a TP all-reduce per op) in `stage_time_ns`; (3) the search-free bounds
# (bounds.py), which count devices per type and must not overcount what a group of them runs.
# Engines iterate slots and take every coefficient from costs.py, so they need no other change.
# Tensor parallelism (issue 20) does not add a kind yet: with one degree per plan, lowering makes each
# TP group one device of its own type key `<type>/tp<t>` with per-rank costs (NOTE [tensor-parallel
# costs] in passes/tp_lower.py), so every engine, bound and the verifier apply to it exactly; degrees
# mixed in one plan keep that, with memory per type key (NOTE [memory per slot type] in costs.py).
SLOT_KINDS = ("device",)


@dataclass(frozen=True)
class Slot:
    """What one stage runs on (NOTE [slots]): today one device."""

    name: str  # unique; for kind "device", the device's name
    kind: str  # one of SLOT_KINDS
    devices: tuple[str, ...]  # the devices it occupies, all of type `type`
    type: str  # their device type, a key of every node's `time_ns`
    node: str  # the machine its devices sit in


@dataclass(frozen=True)
class Link:
    bandwidth_bytes_per_us: int  # 1 GB/s = 1_000 bytes/us
    latency_ns: int

    def transfer_ns(self, nbytes: int, tensors: int = 1) -> int:
        """Time to move `nbytes` in `tensors` messages over this link; nothing to move costs nothing
        (`costs.transfer_ns`)."""
        from hetpart.partitioner.costs import transfer_ns

        return transfer_ns(self, nbytes, tensors)


SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb")  # the last two: NOTE [virtual-stage schedules]


@dataclass(frozen=True)
class Training:
    """What a training plan adds to the problem (NOTE [training memory] in costs.py).

    In training, a node's TIME_NS is its forward plus its backward, its OUT_BYTES
    the activation plus its gradient, and links carry two transfers per
    microbatch (lowering sets all three); what is left for the partitioner is memory.
    """

    schedule: str  # "gpipe" or "1f1b": how many microbatches' activations a stage keeps
    microbatches: int  # M
    state_bytes: dict[str, int] = field(default_factory=dict)  # weight -> gradient + optimizer state bytes
    virtual_stages: int = 1  # stages per device of an interleaved schedule (NOTE [virtual stages plan] in virtual.py)


@dataclass(frozen=True)
class HeldState:
    """What a run's checkpoint holds of each weight, whole over its ranks (`replan --checkpoint`: NOTE [bytes from
    a checkpoint] in hetpart/replan_checkpoint.py)."""

    source: str  # the checkpoint read (CK/step-<N>)
    step: int  # the steps trained before it was written
    optimizer: str  # the optimizer whose state it holds ("SGD", "AdamW"), or "none"
    value_bytes: dict[str, int]  # weight -> its value's bytes in the checkpoint, the whole tensor
    optimizer_bytes: dict[str, int]  # weight -> its optimizer state tensors' bytes there (SGD without momentum: 0)
    # weight -> the bytes of its 0-dim optimizer state tensors (Adam's step), part of optimizer_bytes: never split, a
    # TP rank's shard reads them whole (`saved_layouts` keeps a 0-dim tensor whole)
    scalar_bytes: dict[str, int] = field(default_factory=dict)

    def whole_bytes(self, weight: str) -> int:
        """The checkpoint's bytes of `weight`: its value and its optimizer state."""
        return self.value_bytes[weight] + self.optimizer_bytes[weight]

    def split_bytes(self, weight: str) -> int:
        """The bytes of `weight` a TP shard takes its share of: all but its 0-dim state tensors."""
        return self.whole_bytes(weight) - self.scalar_bytes.get(weight, 0)

    def moved_bytes(self, weight: str, share: int) -> int:
        """The bytes that move with `share` bytes of `weight`'s value (all of it, or a TP rank's shard, as the
        problem sizes it): the same share of the checkpoint's value and optimizer state, rounded up, and its
        0-dim state tensors whole."""
        value, scalar = self.value_bytes[weight], self.scalar_bytes.get(weight, 0)
        return -(-share * self.split_bytes(weight) // value) + scalar if value else self.whole_bytes(weight)


T = TypeVar("T")

# NOTE [problem caches]
# What is derived from a problem's fields and read often (the device index, its kinds, its slots, the
# transfer floor's gap table, ...) is kept on the problem by `Problem.kept`, under a name and a key saying
# what it was derived from (the ids and lengths of the fields it reads: a field is replaced or appended to,
# as a re-plan's `devices` is, and a changed key derives it again). It is no dataclass field, so
# `dataclasses.replace` and equality ignore it, and a replaced problem derives its own.


@dataclass
class Problem:
    """A DAG with integer costs, the devices, and the links between them.

    `graph` nodes carry the attributes named by the module constants above.
    `weights` maps a weight name to its size; a stage holds every weight any of
    its nodes reads, once (a weight read by two stages is replicated).
    """

    graph: nx.DiGraph
    weights: dict[str, int]
    devices: list[Device]
    intra_node_links: dict[str, Link]  # machine name -> link between two devices on it
    network: Link  # between two devices on different machines
    max_stages: int | None = None  # default: one stage per device
    training: Training | None = None  # None: an inference plan
    # slot type -> weight -> held bytes (weight + training state) where a type's differ from `weights` and
    # `training.state_bytes`; None: every type holds the same (NOTE [memory per slot type] in costs.py)
    held_bytes_of: dict[str, dict[str, int]] | None = None
    # slots of several TP degrees: what their gradient sync slices (NOTE [mixed-degree gradient sync] in
    # tp_sync.py); None: NOTE [gradient sync] over the slots as they are
    tp_sync: TPSyncLayout | None = None
    # `replan --checkpoint`: the state that moves with each weight is what a run's checkpoint holds (NOTE [bytes from
    # a checkpoint] in hetpart/replan_checkpoint.py); None: as the plan costs it (`state_to_move_bytes`)
    checkpoint_state: HeldState | None = None

    def kept(self, name: str, key: Hashable, build: Callable[[], T] | None = None) -> T | None:
        """NOTE [problem caches]: the value kept under `name` for `key`; else `build()`'s, kept (None with no
        `build`: the caller derives it and `keep`s it when it may)."""
        hit = self.__dict__.setdefault("_kept", {}).get(name)
        if hit is not None and hit[0] == key:
            return hit[1]
        if build is None:
            return None
        value = build()
        self.keep(name, key, value)
        return value

    def keep(self, name: str, key: Hashable, value: object) -> None:
        """Keep `value` under `name` for `key` (NOTE [problem caches])."""
        self.__dict__.setdefault("_kept", {})[name] = (key, value)

    def device(self, name: str) -> Device:
        # An index by name (a linear search per call made the DP quadratic in devices: 4.8 s on 4,096 devices,
        # NOTE [bounds deadline]).
        index = self.kept("device index", (id(self.devices), len(self.devices)),
                          lambda: {d.name: d for d in reversed(self.devices)})
        try:
            return index[name]
        except KeyError:
            raise KeyError(name) from None

    def device_kinds(self, machine: str | None = None) -> dict[tuple[str, int], int]:
        """Devices per kind (type, capacity_bytes), in first-seen order: of every machine, or of `machine`
        (none: {}). Counted once per `devices` list, like `device`'s index (each LP of NOTE [pipelines bound]
        and each striped machine set read it); the caller gets its own copy."""
        def count() -> dict[str | None, dict[tuple[str, int], int]]:
            per: dict[str | None, dict[tuple[str, int], int]] = {None: {}}
            for d in self.devices:
                for m in (None, d.node):
                    c = per.setdefault(m, {})
                    c[(d.type, d.capacity_bytes)] = c.get((d.type, d.capacity_bytes), 0) + 1
            return per

        return dict(self.kept("device kinds", (id(self.devices), len(self.devices)), count).get(machine, {}))

    @property
    def slots(self) -> list[Slot]:
        """The slots a stage may run on (NOTE [slots]): one "device" slot per device, in device order."""
        return self._slot_index()[0]

    def slot(self, name: str) -> Slot:
        """The slot named `name`."""
        try:
            return self._slot_index()[1][name]
        except KeyError:
            raise KeyError(name) from None

    def _slot_index(self) -> tuple[list[Slot], dict[str, Slot]]:
        def index() -> tuple[list[Slot], dict[str, Slot]]:
            slots = [Slot(name=d.name, kind="device", devices=(d.name,), type=d.type, node=d.node)
                     for d in self.devices]
            return slots, {s.name: s for s in reversed(slots)}

        return self.kept("slots", (id(self.devices), len(self.devices)), index)  # NOTE [problem caches]

    def link(self, a: str, b: str) -> Link:
        """The link between devices named `a` and `b` (`costs.link_between`)."""
        from hetpart.partitioner.costs import link_between

        return link_between(self, a, b)

    @property
    def device_types(self) -> list[str]:
        """The cluster's device types, sorted; listed once per `devices` list (NOTE [problem caches]: each
        `allowed_types` call reads them), the caller gets its own copy."""
        types = self.kept("device types", (id(self.devices), len(self.devices)),
                          lambda: tuple(sorted({d.type for d in self.devices})))
        return list(types)

    def node_order(self) -> list[str]:
        """One stable topological order: PIN_FIRST nodes as early, PIN_LAST as late as edges allow.

        Ties are broken by node name, so the same graph always gives the same order.
        """
        rank = {PIN_FIRST: 0, None: 1, PIN_LAST: 2}
        pins = {v: rank.get(self.graph.nodes[v].get(PIN), 1) for v in self.graph.nodes}
        return list(nx.lexicographical_topological_sort(self.graph, key=lambda v: (pins[v], str(v))))

    def device_classes(self) -> list[list[str]]:
        """Devices grouped into classes of interchangeable ones (same type, machine and capacity).

        Swapping two devices of a class changes no cost, so solvers use a class's
        devices in list order. Classes and their members keep `devices` order.
        """
        classes: dict[tuple[str, str, int], list[str]] = {}
        for d in self.devices:
            classes.setdefault((d.type, d.node, d.capacity_bytes), []).append(d.name)
        return list(classes.values())

    def colocation_groups(self) -> dict[str, list[str]]:
        """COLOCATE group name -> its nodes (in `node_order`), for groups of two or more nodes."""
        groups: dict[str, list[str]] = {}
        if all(a.get(COLOCATE) is None for _, a in self.graph.nodes(data=True)):
            return groups  # (node_order costs a topological sort)
        for v in self.node_order():
            name = self.graph.nodes[v].get(COLOCATE)
            if name is not None:
                groups.setdefault(name, []).append(v)
        return {name: vs for name, vs in sorted(groups.items()) if len(vs) > 1}

    def allowed_types(self, v: str) -> list[str]:
        """The device types of the cluster that can run node `v` (not in its FORBIDDEN_TYPES)."""
        forbidden = self.graph.nodes[v].get(FORBIDDEN_TYPES)
        if not forbidden:
            return self.device_types  # (a fresh list of the kept types)
        return [t for t in self.device_types if t not in forbidden]

    def weights_read(self, nodes: Iterable[str]) -> set[str]:
        """The weights `nodes` read, each once: what a stage (or block) of them holds, whatever the node order."""
        g = self.graph
        return {w for v in nodes for w in g.nodes[v].get(WEIGHTS, ())}

    def validate(self) -> None:
        """Raise HetpartError listing every way this problem is malformed."""
        errors: list[str] = []
        g = self.graph
        if g.number_of_nodes() == 0:
            errors.append("the graph has no nodes; trace a model with at least one op")
        if not nx.is_directed_acyclic_graph(g):
            errors.append(f"the graph has a cycle: {nx.find_cycle(g)}; the partitioner needs a DAG")
        if not self.devices:
            errors.append("the cluster has no devices; list at least one in the cluster file")
        names = Counter(d.name for d in self.devices)
        dupes = sorted(n for n, count in names.items() if count > 1)
        if dupes:
            errors.append(f"device names used twice: {dupes}; give every device a unique name")
        types = self.device_types
        for v, attrs in g.nodes(data=True):
            times = attrs.get(TIME_NS)
            missing = [t for t in types if not isinstance(times, dict) or t not in times]
            if missing:
                errors.append(
                    f"node {v!r} has no {TIME_NS} for device type(s) {missing}; "
                    "run the op-cost pass for every device type of the cluster"
                )
            elif any(not isinstance(times[t], int) or times[t] < 0 for t in types):
                errors.append(f"node {v!r}: {TIME_NS} must be non-negative ints, got {times}")
            for attr in (MEM_BYTES, OUT_BYTES):
                val = attrs.get(attr, 0)
                if not isinstance(val, int) or val < 0:
                    errors.append(f"node {v!r}: {attr} must be a non-negative int, got {val!r}")
            tensors = attrs.get(OUT_TENSORS, 1)
            if not isinstance(tensors, int) or isinstance(tensors, bool) or tensors < 1:
                errors.append(f"node {v!r}: {OUT_TENSORS} must be an int >= 1 (its output's tensors), got {tensors!r}")
            unknown = [w for w in attrs.get(WEIGHTS, ()) if w not in self.weights]
            if unknown:
                errors.append(f"node {v!r} reads weight(s) {unknown} missing from Problem.weights")
            forbidden = attrs.get(FORBIDDEN_TYPES, ())
            if isinstance(forbidden, str) or not all(isinstance(t, str) for t in forbidden):
                errors.append(f"node {v!r}: {FORBIDDEN_TYPES} must be a tuple of device type names, got {forbidden!r}")
            group = attrs.get(COLOCATE)
            if group is not None and not isinstance(group, str):
                errors.append(f"node {v!r}: {COLOCATE} must be a group name (str) or None, got {group!r}")
            if attrs.get(PIN) not in (None, PIN_FIRST, PIN_LAST):
                errors.append(f"node {v!r}: {PIN} must be {PIN_FIRST!r}, {PIN_LAST!r} or None")
        if g.number_of_nodes() and all(a.get(PIN) == PIN_LAST for _, a in g.nodes(data=True)):
            errors.append(f"every node is pinned {PIN_LAST!r}; a stage needs at least one node that is not")
        per_machine = Counter(d.node for d in self.devices)
        for m in sorted(per_machine):
            if per_machine[m] > 1 and m not in self.intra_node_links:
                errors.append(f"machine {m!r} has several devices but no entry in intra_node_links")
        for where, link in [("network", self.network), *sorted(self.intra_node_links.items())]:
            if link.bandwidth_bytes_per_us <= 0 or link.latency_ns < 0:
                errors.append(f"link {where!r} needs bandwidth > 0 and latency >= 0, got {link}")
        if self.training is not None:
            t = self.training
            if t.schedule not in SCHEDULES or t.microbatches < 1:
                errors.append(f"training needs a schedule in {SCHEDULES} and microbatches >= 1, got "
                              f"{t.schedule!r} and {t.microbatches}")
            unknown_state = sorted(set(t.state_bytes) - set(self.weights))
            if unknown_state or any(not isinstance(b, int) or b < 0 for b in t.state_bytes.values()):
                errors.append(f"training.state_bytes must map weights of Problem.weights to non-negative ints "
                              f"(unknown: {unknown_state[:5]})")
        if self.max_stages is not None and self.max_stages < 1:
            errors.append(f"max_stages must be at least 1, got {self.max_stages}")
        if errors:
            raise HetpartError("partitioner: invalid problem:\n  " + "\n  ".join(errors))


@dataclass
class StageCost:
    """What one stage of a plan costs, recomputed from the problem (see evaluate.py)."""

    index: int
    device: str  # the slot's one device (NOTE [slots])
    device_type: str
    nodes: list[str]
    compute_ns: int
    comm_in_ns: int  # boundary with the previous stage
    comm_out_ns: int  # boundary with the next stage
    memory_bytes: int
    capacity_bytes: int
    slot: str = ""  # the slot the stage runs on ("" in hand-made StageCosts: `device`'s)
    devices: tuple[str, ...] = ()  # the slot's devices

    @property
    def time_ns(self) -> int:
        from hetpart.partitioner.costs import stage_time_ns

        return stage_time_ns(self.compute_ns, self.comm_in_ns, self.comm_out_ns)


@dataclass
class Certificate:
    """Where a plan's (or placement's) lower bound comes from, and whether it was re-proved
    by an independent route (NOTE [checked certificates] in certificate.py)."""

    bound_source: str  # the engine whose bound is the claimed one: "cpsat_objective_bound", "ideal_dp", ...
    relaxation: str  # what that engine relaxes or assumes, in words
    checked_by: str = ""  # the re-proof's route ("cpsat_no_presolve", "brute_force"); "" when not checked
    verdict: str = "not_checked"  # "confirmed", "refuted" (status downgraded), "unconfirmed" or "not_checked"
    reproved_bound: float | None = None  # the route's proven bound, in the claim's units
    warning: str = ""  # why the claim was downgraded or left unconfirmed

    def to_json(self) -> dict:
        return {"bound_source": self.bound_source, "relaxation": self.relaxation, "checked_by": self.checked_by,
                "verdict": self.verdict, "reproved_bound": self.reproved_bound, "warning": self.warning}


@dataclass(frozen=True)
class SubBound:
    """One problem of a union a plan was chosen over (NOTE [bound over a union] in tp_choice.py): its best plan's
    value and proven bound (None: no plan fits), and that bound's search-free bounds and certificate."""

    problem: str  # "TP 2", "mixed relaxation", ...
    value_ns: int | None
    bound_ns: int | None
    bounds: Bounds | None = None
    certificate: Certificate | None = None


@dataclass
class Plan:
    """The answer: which stage each node is in, which slot runs each stage (NOTE [slots]).

    `Plan(..., device_of_stage=[...])` still constructs one (each name a device's "device" slot).
    """

    stage_of: dict[str, int]
    slot_of_stage: list[str]
    stages: list[StageCost]
    bottleneck_ns: int
    lower_bound_ns: int  # proven: no plan of this problem is faster (in terms of `objective`)
    solver_status: str  # "OPTIMAL", "WITHIN_GAP" (certified within solve's gap) or "FEASIBLE"
    solve_seconds: float
    stats: SolveStats | dict[str, float] = field(default_factory=dict)  # solve's: SolveStats; dp_hint's: its counters
    bounds: Bounds | None = None  # the search-free and solver bounds of the bottleneck (bounds.py)
    objective: str = "throughput"  # NOTE [objectives] in evaluate.py; lower_bound_ns bounds this
    objective_ns: int | None = None  # the plan's value of `objective`; None means bottleneck_ns
    microbatches: int = 1  # M of the iteration objective
    certificate: Certificate | None = None  # the bound's provenance and its re-proof (certificate.py)
    # A plan chosen over several problems: each one's bound, and the one whose bound, `bounds` and `certificate`
    # these are (NOTE [bound over a union] in tp_choice.py); () and "" for a plan of one problem.
    union: tuple[SubBound, ...] = ()
    bound_problem: str = ""

    @property
    def device_of_stage(self) -> list[str]:
        """Each stage's one device: its slot's (NOTE [slots]; a "device" slot is named as its device)."""
        for s in self.stages:
            if s.devices and len(s.devices) != 1:
                raise ValueError(f"stage {s.index} runs on slot {s.slot!r} of {len(s.devices)} devices; "
                                 "read slot_of_stage and the stages' devices instead")
        return list(self.slot_of_stage)

    @property
    def value_ns(self) -> int:
        """The plan's value of its objective (the bottleneck for throughput)."""
        return self.bottleneck_ns if self.objective_ns is None else self.objective_ns

    @property
    def gap(self) -> float:
        """Relative distance to the proven bound: 0.0 means proven optimal."""
        if self.value_ns <= 0:
            return 0.0
        return max(0.0, (self.value_ns - self.lower_bound_ns) / self.value_ns)


_plan_fields_init = Plan.__init__


def _plan_init(self: Plan, *args: object, device_of_stage: list[str] | None = None, **kwargs: object) -> None:
    # `device_of_stage=` spells `slot_of_stage=` for single-device slots (NOTE [slots]); it wins, so
    # `dataclasses.replace(plan, device_of_stage=...)` changes the stages' slots too.
    if device_of_stage is not None:
        kwargs["slot_of_stage"] = list(device_of_stage)
    _plan_fields_init(self, *args, **kwargs)


Plan.__init__ = _plan_init  # type: ignore[method-assign]


def stage_weights(problem: Problem, stage_of: Mapping[str, int]) -> dict[int, set[str]]:
    """Stage -> the weights its nodes read (`Problem.weights_read`), the stages in the order they first appear."""
    nodes: dict[int, list[str]] = {}
    for v, k in stage_of.items():
        nodes.setdefault(k, []).append(v)
    return {k: problem.weights_read(vs) for k, vs in nodes.items()}
